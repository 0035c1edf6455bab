"""Inputs files read by the YAML spec's rule that a mapping's keys are unique.

`pyflyte run` / `union run` read `--inputs-file` with PyYAML's `safe_load`, which lets a key given twice
pass and silently keeps the last value (`max_steps: 4` then `max_steps: 8` trains 8 steps, and nobody sees
the 4). Installed by the workflow modules before the CLI reads the file: a repeated key is then a YAML
error, which the CLI reports as a bad `--inputs-file`, naming the key and its lines, before anything runs.
An empty inputs file, or one whose top level is a list, is one the same way (the CLI would crash on it).
"""

import types

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
    """Make `yaml.safe_load` refuse a mapping that repeats a key, and the CLI an inputs file that is not a
    mapping (idempotent)."""
    yaml.SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)
    require_mapping()


class NotAMapping(yaml.YAMLError):
    """An inputs file whose top level is not a mapping of workflow inputs."""


def _inputs_mapping(stream: str) -> dict:
    """`yaml.safe_load`, for the CLI's `--inputs-file`: an empty file, or one whose top level is a list or a
    value, is a YAML error naming what it is (the CLI shows it as a bad --inputs-file), not a crash."""
    data = yaml.safe_load(stream)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__} ({str(data)[:60]!r})"
        raise NotAMapping(
            f"the inputs file must be a mapping of workflow inputs (e.g. `training_args: {{...}}`, `n_runs: 2`); "
            f"it is {what}"
        )
    return data


def require_mapping() -> None:
    """Make the CLI's reading of `--inputs-file` refuse a file that is not a mapping (idempotent). Only the CLI's
    own reference to yaml is replaced: every other reader of YAML keeps `yaml.safe_load` as it is."""
    from flytekit.clis.sdk_in_container import run

    if getattr(run.yaml, "safe_load", None) is not _inputs_mapping:
        run.yaml = types.SimpleNamespace(safe_load=_inputs_mapping, YAMLError=yaml.YAMLError)
