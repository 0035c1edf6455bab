"""Inputs files read by the YAML spec's rule that a mapping's keys are unique.

`pyflyte run` / `union run` read `--inputs-file` with PyYAML's `safe_load`, which lets a key given twice
pass and silently keeps the last value (`max_steps: 4` then `max_steps: 8` trains 8 steps, and nobody sees
the 4). Installed by the workflow modules before the CLI reads the file: a repeated key is then a YAML
error, which the CLI reports as a bad `--inputs-file`, naming the key and its lines, before anything runs.
"""

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode


def _unique_keys_mapping(loader: yaml.SafeLoader, node: MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"the key {key!r} is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                "YAML keys must be unique, and the last one would silently win",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


def require_unique_keys() -> None:
    """Make `yaml.safe_load` refuse a mapping that repeats a key (idempotent)."""
    yaml.SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)
