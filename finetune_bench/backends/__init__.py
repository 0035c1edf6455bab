"""What trains a condition: one module per `TrainingArgs.backend` value (see `spec.BACKENDS`),
each with a `train(args, dataset_dir, model_dir, device, dtype, recorder, work_dir) -> dict`."""
