"""An inputs file read as a whole, before anything converts it input by input.

`pyflyte run` / `union run` convert a workflow's inputs one at a time and stop at the first that fails: a file with
a bad `experiment_args` never has its `training_args` looked at. Here every input of the file is read the way its
conversion reads it (a settings section by its own checks, `StrictFromJson.from_mapping`; a value by its type), and
when one cannot be read, the workflow's own settings that could be are checked too, so that one message names every
problem. A file whose inputs all read is left to planning, which checks the rest (conditions, where outputs go)
together.
"""

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from finetune_bench.inputs.errors import Problems, SpecError, closest, shown_name
from finetune_bench.inputs.rules import check_list, check_value
from finetune_bench.inputs.sections import StrictFromJson
from finetune_bench.inputs.settings import ExperimentArgs
from finetune_bench.inputs.validation import check_grid_size
from finetune_bench.inputs.yaml11 import yaml11_traps


@dataclass
class ReadInputs:
    """A workflow's inputs as read from a file: every input's value (the file's, or the workflow's default where the
    file has none or has one that cannot be read), which could not be read, and why."""

    values: dict[str, Any]
    unread: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_inputs(data: Mapping[str, Any], interface: Mapping[str, tuple[Any, Any]], workflow: str) -> ReadInputs:
    """Read each input of `data` against `interface` (name → (annotation, default)), every problem kept: a key that
    is no input of `workflow`, a section's unknown keys and bad values, a value of the wrong type."""
    read = ReadInputs(values={name: default for name, (_, default) in interface.items()})
    read.problems.extend(yaml11_traps(data))
    for key, value in data.items():
        problems = Problems()
        with problems.check():
            if key not in interface:
                hint = section_pointer(str(key), interface, workflow) or closest(str(key), list(interface))
                raise SpecError(f"{shown_name(key)} is not an input of {workflow}{hint}")
            read.values[key] = _read(str(key), interface[key][0], value, _sections(interface, str(key)))
        if problems.found:
            read.problems.extend(p for p in problems.found if p not in read.problems)
            if key in interface:
                read.unread.append(str(key))
    return read


# Each workflow's own sections, and where a section of another workflow's goes in its inputs (a file written for one
# workflow given to another).
_SECTIONS = {
    "benchmarking_experiment": ("experiment_args", "training_args"),
    "memory_frontier": ("training_args", "arms", "batch_size_search", "seq_length_search", "probes"),
    "kernel_benchmark": ("sweep",),
}
_INSTEAD = {
    "benchmarking_experiment": "its axes go under experiment_args: (e.g. experiment_args: {arm: [liger, baseline]}), "
    "one condition's settings under training_args:",
    "memory_frontier": "the frontier sweeps no axes: its arms go under arms: ([{arm: liger}, {arm: baseline}]), the "
    "sizes it searches under batch_size_search: and seq_length_search:, the rest under training_args:",
    "kernel_benchmark": "every setting of the kernel benchmark goes under sweep: (e.g. sweep: {kernels: [rms_norm]})",
}


# The name `_sections` gives the workflow's plain inputs (those that are no section), as if they were one.
TOP_LEVEL = ""


def section_pointer(key: str, interface: Mapping[str, tuple[Any, Any]], workflow: str) -> str:
    """Where `key`, which is no input of `workflow`, goes: under the section of `workflow` that has it as a setting,
    or, for another workflow's section, where this workflow takes what it holds; "" when neither."""
    for name, (annotation, _) in interface.items():
        options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
        for option in options:
            if isinstance(option, type) and issubclass(option, StrictFromJson):
                if key in {f.name for f in dataclasses.fields(option)}:
                    return f": it is a setting of {name}; write it under {name}:"
    for other, sections in _SECTIONS.items():
        if key in sections and other != workflow and workflow in _INSTEAD:
            return f": it is a section of {other}'s inputs, not of {workflow}'s; {_INSTEAD[workflow]}"
    return ""


def _sections(interface: Mapping[str, tuple[Any, Any]], but: str) -> dict[str, type]:
    """The settings sections of a workflow (input name → its dataclass, the item's for a list of them) other than
    `but`: where a key that is not a setting of `but` may belong; and, under `TOP_LEVEL`, the workflow's plain
    inputs (a key such as `accelerator` or `force_fresh` written inside a section belongs at the top)."""
    sections, plain = {}, []
    for name, (annotation, _) in interface.items():
        options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
        section = [
            o for o in (_list_item(o) or o for o in options) if isinstance(o, type) and issubclass(o, StrictFromJson)
        ]
        if section and name != but:
            sections[name] = section[0]
        elif not section:
            plain.append(name)
    sections[TOP_LEVEL] = dataclasses.make_dataclass("WorkflowInputs", [(name, object) for name in plain])
    return sections


def _read(key: str, annotation: Any, value: Any, elsewhere: Mapping[str, type]) -> Any:
    """One input's value as its conversion would have it; a SpecError naming every problem of it."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    (annotation,) = [option for option in options if option is not type(None)][:1] or (annotation,)
    item = _list_item(annotation)
    if value is None and type(None) in options:
        if item is not None:
            # Written null (`arms: ~`, or every item commented out): the CLI cannot convert it, and leaving the
            # input out is what gives its default.
            _check_list_shape(key, item, value)
        return None
    if isinstance(annotation, type) and issubclass(annotation, StrictFromJson):
        return annotation.from_mapping(value, key, elsewhere)
    if item is not None and isinstance(item, type) and issubclass(item, StrictFromJson):
        problems, items = Problems(), []
        with problems.check():
            _check_list_shape(key, item, value)
        if not isinstance(value, list):
            problems.raise_if_any()
        for index, element in enumerate(value):
            if isinstance(element, dict):  # any other item is named by the list's check
                with problems.check():
                    items.append(item.from_mapping(element, f"{key}[{index}]", elsewhere))
        problems.raise_if_any()
        return items
    check_value(key, annotation, value)
    return value


def _check_list_shape(key: str, item: Any, value: Any) -> None:
    """`value` a list of `item`s (`rules.check_list`), a section's items each a mapping written from its first
    setting (`{arm: liger}`)."""
    if isinstance(item, type) and issubclass(item, StrictFromJson):
        first = dataclasses.fields(item)[0].name
        check_list(key, value, dict, key, getattr(item, "LIST_EXAMPLE", ""), wrap=f"{{{{{first}: {{}}}}}}")
    else:
        check_list(key, value, None)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _list_item(annotation: Any) -> Any:
    """The item type of `list[X]`, else None."""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        return item
    return None


def check_inputs_file(
    data: Mapping[str, Any],
    interface: Mapping[str, tuple[Any, Any]],
    workflow: str,
    settings_checks: Sequence[Callable[..., None]] = (),
) -> None:
    """Refuse an inputs file that has an input which cannot be read, with every problem of the file in one SpecError:
    each input's, then those of `settings_checks` (checks of the workflow's own settings, each called with the inputs
    its parameters name; an input that could not be read stands at its default there, so it is named once). A file
    whose inputs all read passes: planning checks it as a whole."""
    read = read_inputs(data, interface, workflow)
    if not read.problems:
        return
    problems = Problems()
    problems.found.extend(read.problems)
    for check in settings_checks:
        with problems.check():
            check(**{name: read.values[name] for name in inspect.signature(check).parameters if name in read.values})
    problems.raise_if_any()


def check_n_runs(n_runs: int) -> None:
    """`n_runs` alone (a positive integer, at most `MAX_RUNS` repeats of one condition); planning checks it with the
    grid's size."""
    check_grid_size(ExperimentArgs(), n_runs)
