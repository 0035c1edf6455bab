"""Predictions before anything runs: a model's shape from its config, the peak memory of a training step with its
breakdown, and a grid's fits, step times, GPU-hours and cost."""
