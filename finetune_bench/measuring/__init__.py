"""What a training step costs: per-step time, tokens, memory and loss (the step recorder), the GPU as its
driver sees it, model FLOPs and MFU, and the environment a run happened in."""
