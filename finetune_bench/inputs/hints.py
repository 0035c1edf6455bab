"""What the inputs' messages suggest: where a key that is not a setting of its section goes instead (an axis that
cannot be swept, another section of the workflow), what Liger's, TRL's and the tutorials' own names are here, or the
nearest name; and how an axis's list is written."""

import dataclasses
from collections.abc import Collection, Mapping

from finetune_bench.inputs.errors import closest, shown_name
from finetune_bench.inputs.tutorial import TUTORIAL_KEYS

# Keys users bring from Liger's and TRL's own switches, and from earlier versions of these inputs.
_LIGER_SWITCH_HINT = "liger on/off is the arm axis: arm: [liger, baseline]"
_RENAMED = {key: _LIGER_SWITCH_HINT for key in ("liger", *(k for k, e in TUTORIAL_KEYS.items() if e.setting == "arm"))}
# Names other tools give settings that spelling alone would match to another one (`batch_size` is nearer
# `per_device_eval_batch_size` than the training batch it means).
_ALIASES = {"batch_size": "per_device_train_batch_size", "train_batch_size": "per_device_train_batch_size"}


def not_a_setting(
    section: str,
    key: object,
    cls: type,
    elsewhere: Mapping[str, type],
    unsweepable: Collection[str] = (),
    from_tutorials: bool = False,
) -> str:
    """The message for `key`, not a field of the section `cls` read as `section`: `elsewhere`, the workflow's other
    sections by name; `unsweepable`, training settings that this section (the axes) cannot take; `from_tutorials`,
    whether the tutorials' keys (`TUTORIAL_KEYS`) are looked up. A key with spaces around it, or a character that
    does not show, is quoted with its escapes."""
    name = str(key)
    known = [f.name for f in dataclasses.fields(cls)]
    hint = _RENAMED.get(name) if "arm" in known else None
    alias = _ALIASES.get(name)
    tutorial = TUTORIAL_KEYS.get(name) if from_tutorials else None
    pointer = _other_section(cls, name, elsewhere, unsweepable)
    if pointer:
        suggestion = pointer
    elif hint:
        suggestion = f" (did you mean 'arm'? {hint})"
    elif alias in known:
        suggestion = f" (did you mean {alias!r}?)"
    elif tutorial is not None:
        suggestion = tutorial.suggestion
    else:
        suggestion = closest(name, known)
    return f"{section}.{shown_name(key)} is not a setting{suggestion}"


def _other_section(cls: type, key: str, elsewhere: Mapping[str, type], unsweepable: Collection[str]) -> str:
    """Where `key`, not a setting of `cls`, goes: a training setting given as an axis cannot be swept; a setting of
    another section of the workflow (`elsewhere`) is written under it; "" when neither."""
    if key in unsweepable:
        return (
            f": {key} is a training setting that cannot be swept; set one value for every condition under "
            f"training_args: (training_args: {{{key}: ...}})"
        )
    sections = [
        name
        for name, other in elsewhere.items()
        if other is not cls and key in {f.name for f in dataclasses.fields(other)}
    ]
    if not sections:
        return ""
    if sections == [""]:  # a plain input of the workflow (`inputs.reading.TOP_LEVEL`)
        return f": it is an input of the workflow, not of a section; write it at the top level of the file ({key}: ...)"
    sections = [name for name in sections if name]
    if len(sections) == 1:
        return f": it is a setting of {sections[0]}; write it under {sections[0]}:"
    return f": it is a setting of {' and '.join(sections)}; write it under the one it is meant for"


# How an axis's list is written, in messages (other axes: their training_args default).
AXIS_EXAMPLES = {
    "arm": "liger, baseline",
    "per_device_train_batch_size": "1, 2",
    "max_seq_length": "512, 1024",
    "gradient_accumulation_steps": "1, 4",
    "gradient_checkpointing": "false, true",
    "learning_rate": "1.0e-5, 2.0e-5",
    "num_gpus": "1, 2",
    "num_nodes": "1, 2",
    "model_config_overrides": "'', num_hidden_layers=8",
    "software_set": "'', liger-kernel==0.8.2",
}
