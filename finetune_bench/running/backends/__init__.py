"""What trains a run: one module per `TrainingArgs.backend` value (see `finetune_bench.inputs.catalog.BACKENDS`),
each with a `train(args, dataset_dir, model_dir, device, dtype, recorder, work_dir) -> dict`."""
