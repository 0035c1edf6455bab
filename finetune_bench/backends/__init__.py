"""What trains a condition. Each backend maps `TrainingArgs.backend` to a `train` function."""
