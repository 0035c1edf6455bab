"""Flyte tasks: thin wrappers that call `finetune_bench` and move files and records."""
