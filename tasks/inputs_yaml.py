"""Inputs files read by the YAML spec's rule that a mapping's keys are unique.

`pyflyte run` / `union run` read `--inputs-file` with PyYAML's `safe_load`, which lets a key given twice
pass and silently keeps the last value (`max_steps: 4` then `max_steps: 8` trains 8 steps, and nobody sees
the 4). Installed by the workflow modules before the CLI reads the file: a repeated key is then a YAML
error, which the CLI reports as a bad `--inputs-file`, naming the key and its lines, before anything runs.
YAML 1.1's merge keys (`<<: *defaults`) work as the spec says: a key beside a merge overrides the merged value.
An empty inputs file, or one whose top level is a list, is one the same way (the CLI would crash on it), and
a file over MAX_INPUTS_FILE_BYTES is refused before it is parsed.

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
from yaml.nodes import MappingNode, SequenceNode

# The tag PyYAML's resolver gives a `<<` key: YAML 1.1's merge key (`<<: *defaults`).
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _unique_keys_mapping(loader: yaml.SafeLoader, node: MappingNode, deep: bool = False) -> dict:
    """A mapping whose keys are unique, with YAML 1.1's merge keys: `<<: *defaults` (or `<<: [*a, *b]`) brings in
    the merged mappings' keys, and a key given beside them overrides the merged value (that is what a merge is for,
    not a repeat); a key given twice in the mapping itself still is one."""
    _check_explicit_keys(loader, node, deep)
    return loader.construct_mapping(node, deep=deep)  # flattens the merge keys (SafeConstructor.flatten_mapping)


def _check_explicit_keys(loader: yaml.SafeLoader, node: MappingNode, deep: bool) -> None:
    """Refuse a key written twice in `node` itself, and in each mapping it merges. Checked before the merges are
    flattened into the node (after, a merged key and its override cannot be told apart); each node once, as a
    merged node may be flattened by the mapping that merges it before it is constructed where it was written."""
    checked: set[int] = loader.__dict__.setdefault("_finetune_bench_checked_mappings", set())
    if id(node) in checked:
        return
    checked.add(id(node))
    seen: dict = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for mapping in merged:
                if isinstance(mapping, MappingNode):  # anything else: flatten_mapping says what it expected
                    _check_explicit_keys(loader, mapping, deep)
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            line = seen.get(key)
        except TypeError:  # an unhashable key: construct_mapping refuses it, naming it
            continue
        if line is not None:
            raise ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"the key {key!r} is given twice (lines {line + 1} and {key_node.start_mark.line + 1}); "
                "YAML keys must be unique, and the last one would silently win",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line


def require_unique_keys() -> None:
    """Make `yaml.safe_load` refuse a mapping that repeats a key, and the CLI an inputs file that is not a
    mapping (idempotent)."""
    yaml.SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)
    require_mapping()


class NotAMapping(yaml.YAMLError):
    """An inputs file whose top level is not a mapping of workflow inputs."""


# The largest inputs file read: the bundled ones are under 2 KB, and PyYAML parses a few hundred KB a second, so a
# 50 MB file would keep the CLI busy for minutes before any check said a word about it.
MAX_INPUTS_FILE_BYTES = 1024 * 1024


def _inputs_mapping(stream: str) -> dict:
    """`yaml.safe_load`, for the CLI's `--inputs-file` (the CLI hands over the file's text): a file over
    MAX_INPUTS_FILE_BYTES is refused before it is parsed; an empty file, or one whose top level is a list or a
    value, is a YAML error naming what it is (the CLI shows it as a bad --inputs-file), not a crash."""
    if isinstance(stream, str):
        size = len(stream.encode("utf-8", "surrogatepass"))
        if size > MAX_INPUTS_FILE_BYTES:
            # Not a YAML error: the CLI would try the text as JSON next, and parse a large JSON file after all.
            raise click.BadParameter(
                f"the inputs file is {_size(size)}, over the {_size(MAX_INPUTS_FILE_BYTES)} an inputs file may have "
                "(they are a few KB); refused before it is parsed",
                param_hint="'--inputs-file'",
            )
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


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:,.1f} MiB" if n >= 1024 * 1024 else f"{n:,} bytes"


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
            hint = migration_hint(data, inputs_file_argument())
            raise click.BadParameter(str(error) + (f"\n{hint}" if hint else ""), param_hint="'--inputs-file'") from None

    _WHOLE_FILE_CHECKS[name] = check
    require_unique_keys()


def inputs_file_argument() -> str:
    """The `--inputs-file` of this process's command line, written `--inputs-file F` or `--inputs-file=F`, if it has
    one (a local `pyflyte run`, or `union run --remote` registering; a task in a pod has none)."""
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg == "--inputs-file" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--inputs-file="):
            return arg.removeprefix("--inputs-file=")
    return ""


def require_mapping() -> None:
    """Make the CLI's reading of `--inputs-file` refuse a file that is not a mapping (idempotent). Only the CLI's
    own reference to yaml is replaced: every other reader of YAML keeps `yaml.safe_load` as it is."""
    from flytekit.clis.sdk_in_container import run

    if getattr(run.yaml, "safe_load", None) is not _inputs_mapping:
        run.yaml = types.SimpleNamespace(safe_load=_inputs_mapping, YAMLError=yaml.YAMLError)
