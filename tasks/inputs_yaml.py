"""Inputs files read by the YAML spec's rule that a mapping's keys are unique.

`pyflyte run` / `union run` read `--inputs-file` with PyYAML's `safe_load`, which lets a key given twice
pass and silently keeps the last value (`max_steps: 4` then `max_steps: 8` trains 8 steps, and nobody sees
the 4). Installed by the workflow modules before the CLI reads the file: a repeated key is then a YAML
error, which the CLI reports as a bad `--inputs-file`, naming the key and its lines, before anything runs.
An empty inputs file, or one whose top level is a list, is one the same way (the CLI would crash on it).

The CLI then converts the inputs one by one and stops at the first that fails. A workflow registered with
`read_inputs_whole` has its inputs file read as a whole first (`finetune_bench.inputs.reading`): every problem of
every input in one message, with a hint for a file written for the Union tutorial (`finetune_bench.inputs.migrate`).
"""

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import click
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
    context = click.get_current_context(silent=True)  # the workflow's command, parsing its arguments
    check = _WHOLE_FILE_CHECKS.get(context.info_name) if context is not None else None
    if check is not None:
        check(data)
    return data


# Workflow name → the check of a whole inputs file for it (`read_inputs_whole`).
_WHOLE_FILE_CHECKS: dict[str, Callable[[dict], None]] = {}


def read_inputs_whole(workflow: Any, settings_checks: Sequence[Callable[..., None]] = ()) -> None:
    """Have the CLI read an inputs file of `workflow` as a whole before converting it: a file with an input that
    cannot be read is refused with every problem of the file (`finetune_bench.inputs.reading.check_inputs_file`; the
    workflow's own settings by `settings_checks`, which planning runs too), and a one-line hint when it uses the
    Union tutorial's keys. Installs `require_unique_keys` too (idempotent)."""
    from finetune_bench.inputs.errors import SpecError
    from finetune_bench.inputs.migrate import migration_hint
    from finetune_bench.inputs.reading import check_inputs_file

    name = workflow.name.rsplit(".", 1)[-1]
    interface = workflow.python_interface.inputs_with_defaults

    def check(data: dict) -> None:
        try:
            check_inputs_file(data, interface, name, settings_checks)
        except SpecError as error:
            hint = migration_hint(data, _inputs_file_argument())
            raise click.BadParameter(str(error) + (f"\n{hint}" if hint else ""), param_hint="'--inputs-file'") from None

    _WHOLE_FILE_CHECKS[name] = check
    require_unique_keys()


def _inputs_file_argument() -> str:
    """The `--inputs-file` of this process's command line, if it has one."""
    argv = sys.argv
    return next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--inputs-file"), "")


def require_mapping() -> None:
    """Make the CLI's reading of `--inputs-file` refuse a file that is not a mapping (idempotent). Only the CLI's
    own reference to yaml is replaced: every other reader of YAML keeps `yaml.safe_load` as it is."""
    from flytekit.clis.sdk_in_container import run

    if getattr(run.yaml, "safe_load", None) is not _inputs_mapping:
        run.yaml = types.SimpleNamespace(safe_load=_inputs_mapping, YAMLError=yaml.YAMLError)
