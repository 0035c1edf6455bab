"""Per-kernel benchmarks: each Liger kernel against its PyTorch/transformers reference (and torch.compile of the
reference), forward, backward and full pass, speed and peak memory, over a size sweep at a model's shapes."""
