"""Flyte tasks: thin wrappers that call `finetune_bench` and move files and records."""

from tasks.literal_types import cache_dataclass_literal_types

# before any task is defined: each dataclass's literal type computed once per process (see tasks.literal_types)
cache_dataclass_literal_types()
