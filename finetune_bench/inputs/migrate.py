"""Inputs files written for the Union tutorial's workflow, converted to this project's settings.

The conversion reads the one table of what the tutorial's keys become here, `finetune_bench.inputs.tutorial`
(`TUTORIAL_KEYS`), as do the CLI's hint for a file that uses them (`migration_hint`) and the message for each such key.

    python -m finetune_bench.inputs.migrate tutorial_inputs.yaml [--out converted.yaml]     (make migrate INPUTS=...)
"""

import argparse
import dataclasses
import itertools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.rules import field_scope
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.inputs.tutorial import DROP, TUTORIAL_KEYS, TutorialKey, flow

# The sections the table applies to, with the settings each takes.
_SECTIONS = {
    "experiment_args": {f.name for f in dataclasses.fields(ExperimentArgs)},
    "training_args": {f.name for f in dataclasses.fields(TrainingArgs)},
}


@dataclass(frozen=True)
class Converted:
    """One key converted: `was` and `now` as the file spells them (`use_liger: [true, false]`, `arm: [liger, baseline]`;
    a key renamed with its value unchanged, the names alone)."""

    section: str
    was: str
    now: str
    # Where `now` is, when not in `section` ("": the file's top level).
    now_section: str | None = None

    def __str__(self) -> str:
        into = self.section if self.now_section is None else self.now_section
        return f"{self.section}.{self.was} → {into + '.' if into else ''}{self.now}"


@dataclass
class Migration:
    """An inputs file converted: the new inputs, and what was done to each key the conversion touched."""

    inputs: dict[str, Any]
    changed: list[Converted] = field(default_factory=list)
    # "section.key: value: why nothing is lost", one per key left out.
    dropped: list[str] = field(default_factory=list)
    # "section.key: why it cannot be converted", one per key left out that needs a decision by hand.
    not_converted: list[str] = field(default_factory=list)
    # setting → why the value written for it is a placeholder to set by hand (a comment on its line of the file).
    to_set: dict[str, str] = field(default_factory=dict)


def _convert_value(entry: TutorialKey, value: Any) -> Any:
    """The setting's value for the tutorial's `value` (a list: each element), DROP, or KeyError when it has none."""
    if not entry.values:
        return value
    if isinstance(value, list):
        converted = [entry.values[v] for v in value]
        if any(v is DROP for v in converted):
            raise KeyError(value)
        return converted
    return entry.values[value]


def migrate(inputs: Mapping[str, Any]) -> Migration:
    """The tutorial's keys of `training_args` and `experiment_args` converted by `TUTORIAL_KEYS`; any other key of
    those sections that is no setting here is left out and listed as not converted; everything else as it was."""
    result = Migration(inputs=dict(inputs))
    for section, settings in _SECTIONS.items():
        given = inputs.get(section)
        if not isinstance(given, dict):
            continue
        converted: dict[str, Any] = {}
        sources: dict[str, str] = {}  # setting → the tutorial key that set it
        for key, value in given.items():
            entry = TUTORIAL_KEYS.get(key)
            if key in settings:
                converted[key] = value
                continue
            where = f"{section}.{key}: {flow(value)}"
            if entry is None:
                result.not_converted.append(f"{where}: not a setting here, and no equivalent is known")
                continue
            try:
                new = _convert_value(entry, value)
            except (KeyError, TypeError):
                result.not_converted.append(f"{where}: no equivalent for this value ({entry.why or entry.setting})")
                continue
            if entry.setting is None or new is DROP:
                result.dropped.append(f"{where}: {entry.why}")
                continue
            if entry.setting in given or entry.setting in sources:
                other = entry.setting if entry.setting in given else sources[entry.setting]
                result.not_converted.append(f"{where}: {section}.{other} already sets {entry.setting}")
                continue
            sources[entry.setting] = key
            converted[entry.setting] = new
            was, now = (
                (f"{key}: {flow(value)}", f"{entry.setting}: {flow(new)}") if entry.values else (key, entry.setting)
            )
            result.changed.append(Converted(section, was, now))
        result.inputs[section] = converted
    _steps_for_epochs(result, inputs)
    _epochs_to_fine_tune(result, inputs)
    _drop_swept(result)
    _drop_inactive(result)
    return result


def _drop_inactive(result: Migration) -> None:
    """A training_args value that acts in no condition of the converted grid (`rules.acts_only`: the tutorial's
    `per_device_eval_batch_size` without held-out examples) is left out and said: planning would refuse it."""
    training, experiment = result.inputs.get("training_args"), result.inputs.get("experiment_args") or {}
    if not isinstance(training, dict) or not isinstance(experiment, dict):
        return
    try:
        base = TrainingArgs.from_mapping(training)
        axes = {name: values for name, values in experiment.items() if isinstance(values, list) and values}
        conditions = [
            dataclasses.replace(base, **dict(zip(axes, point, strict=True)))
            for point in itertools.product(*axes.values())
        ]
    except (SpecError, TypeError, ValueError):
        return  # planning names what is wrong with the file
    for declared in dataclasses.fields(TrainingArgs):
        scope = field_scope(declared)
        if declared.name not in training or scope is None or any(scope.holds(t) for t in conditions):
            continue
        value = training.pop(declared.name)
        result.dropped.append(f"training_args.{declared.name}: {flow(value)}: it acts only {scope.where}")


def _epochs_to_fine_tune(result: Migration, inputs: Mapping[str, Any]) -> None:
    """The tutorial's `num_train_epochs` is the fine-tune the user plans: it becomes `fine_tune_epochs` (what the
    report projects), unless the file already sets the fine-tune; its line moves from "left out" to "changed"."""
    training = inputs.get("training_args")
    if not isinstance(training, dict) or "num_train_epochs" not in training:
        return
    if "fine_tune_epochs" in inputs or "fine_tune_steps" in inputs:
        return
    epochs = training["num_train_epochs"]
    if isinstance(epochs, bool) or not isinstance(epochs, int | float) or epochs <= 0:
        return
    result.inputs["fine_tune_epochs"] = epochs
    result.dropped = [line for line in result.dropped if not line.startswith("training_args.num_train_epochs:")]
    result.changed.append(
        Converted("training_args", f"num_train_epochs: {flow(epochs)}", f"fine_tune_epochs: {flow(epochs)}", "")
    )


def _drop_swept(result: Migration) -> None:
    """A training_args value for an axis experiment_args sweeps is left out: every condition takes the axis' values
    (planning refuses both given), and nothing is lost."""
    training, experiment = result.inputs.get("training_args"), result.inputs.get("experiment_args")
    if not isinstance(training, dict) or not isinstance(experiment, dict):
        return
    for name in [name for name in training if experiment.get(name)]:
        value = training.pop(name)
        result.dropped.append(
            f"training_args.{name}: {flow(value)}: experiment_args.{name} sweeps it, every condition takes those values"
        )


def _steps_for_epochs(result: Migration, inputs: Mapping[str, Any]) -> None:
    """A file that set how long to train in epochs only (`num_train_epochs`, no `max_steps`) gets max_steps written
    out, marked to set by hand: an epoch's steps depend on the dataset's size, which is not known here, and the
    default (a smoke test's few steps) would otherwise be taken without a word."""
    training, experiment = inputs.get("training_args"), inputs.get("experiment_args")
    if not isinstance(training, dict) or "num_train_epochs" not in training or "max_steps" in training:
        return
    if isinstance(experiment, dict) and "max_steps" in experiment:
        return
    default = TrainingArgs().max_steps
    result.inputs["training_args"]["max_steps"] = default
    result.to_set["max_steps"] = (
        f"SET BY HAND: the tutorial trained num_train_epochs: {flow(training['num_train_epochs'])}; every run here "
        f"trains max_steps optimizer steps (an epoch is the dataset's examples over the batch size), and {default}, "
        "the default, only checks that a run works"
    )


def _with_comments(text: str, to_set: Mapping[str, str]) -> str:
    """The written file with each placeholder setting's line of training_args commented (`max_steps: 4  # ...`)."""
    lines, section = text.splitlines(), ""
    for i, line in enumerate(lines):
        if not line.startswith(" "):
            section = line.rstrip(":")
        key = line.strip().split(":", 1)[0]
        if section == "training_args" and key in to_set:
            lines[i] = f"{line}  # {to_set[key]}"
    return "\n".join(lines) + "\n"


def migration_hint(inputs: Mapping[str, Any], path: str = "") -> str:
    """One line for a file that uses the tutorial's keys: the equivalent settings, and the command that converts
    it; empty for any other file."""
    migration = migrate(inputs)
    if not migration.changed and not migration.dropped:
        return ""
    equivalents = [f"{c.was} → {c.now}" for c in migration.changed]
    if migration.dropped:
        left_out = len(migration.dropped)
        equivalents.append(
            f"{left_out} key(s) left out: nothing to set here, an axis experiment_args sweeps, or a setting that acts "
            "in no condition"
        )
    return (
        f"hint: these are the Union tutorial's keys; `make migrate INPUTS={path or '<this file>'}` writes the file "
        f"with this project's settings ({'; '.join(equivalents)})"
    )


class _InputsDumper(yaml.SafeDumper):
    """YAML as the inputs files are written: sections as blocks, a list of values on one line (`[liger, baseline]`)."""


_InputsDumper.add_representer(
    list,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=not any(isinstance(v, dict | list) for v in value)
    ),
)


def default_out(path: Path) -> Path:
    """Where the converted file goes when no --out is given: beside the file, `<name>.migrated.yaml`."""
    return path.with_name(f"{path.stem}.migrated.yaml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m finetune_bench.inputs.migrate",
        description="Convert an inputs file written for the Union tutorial's workflow to this project's settings.",
    )
    parser.add_argument("inputs", type=Path, help="the inputs file (YAML)")
    parser.add_argument("--out", type=Path, help="where to write the converted file (default: <name>.migrated.yaml)")
    args = parser.parse_args(argv)
    try:
        inputs = yaml.safe_load(args.inputs.read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"cannot read {args.inputs}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(inputs, dict):
        print(f"{args.inputs} is not a mapping of workflow inputs", file=sys.stderr)
        return 2
    migration = migrate(inputs)
    out = args.out or default_out(args.inputs)
    header = f"# Converted from {args.inputs} by `python -m finetune_bench.inputs.migrate` (make migrate).\n"
    written = yaml.dump(migration.inputs, Dumper=_InputsDumper, sort_keys=False, width=100)
    out.write_text(header + _with_comments(written, migration.to_set))
    print(f"wrote {out}")
    for title, lines in (
        ("changed", [str(c) for c in migration.changed]),
        (
            "written with a placeholder: SET BY HAND before a real run",
            [
                f"training_args.{key}: {migration.inputs['training_args'][key]}: {why.removeprefix('SET BY HAND: ')}"
                for key, why in migration.to_set.items()
            ],
        ),
        ("left out (nothing lost)", migration.dropped),
        ("NOT converted (left out of the file: set by hand, see docs/settings.md)", migration.not_converted),
    ):
        if lines:
            print(f"{title}:\n" + "\n".join(f"  {line}" for line in lines))
    if not (migration.changed or migration.dropped or migration.not_converted):
        print("nothing to convert: the file already uses this project's settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
