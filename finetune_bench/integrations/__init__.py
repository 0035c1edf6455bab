"""Services outside the benchmark that its runs are reported to: Weights & Biases (one W&B run per run,
secrets kept out)."""
