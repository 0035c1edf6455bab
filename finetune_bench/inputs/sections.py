"""How one inputs section is read from a mapping: every key a setting of the section, every value of its type and
within its rules, every problem at once, each naming its key.

A section is a dataclass that derives from `StrictFromJson`: the inputs file gives it as a mapping (`from_mapping`,
through `inputs.reading`), flytekit's CLI as JSON (`from_json`). Left to flytekit, a dataclass input drops an unknown
nested key and turns "4096" or 4096.7 into 4096 without a word; here each is refused, naming the key. A section says
how its values are checked (`check_value`: by type, or as training settings by their rules) and how an unknown key
is answered (`unknown_key`: the key it was likely meant to be, or the section it belongs to).
"""

import dataclasses
import json
from collections.abc import Collection, Mapping
from typing import Any

from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.hints import not_a_setting
from finetune_bench.inputs.rules import check_type


class StrictFromJson:
    """`from_json` that rejects unknown keys and values of the wrong type, naming them.

    flytekit's CLI (`pyflyte run` / `union run` with `--inputs-file` or a JSON argument) builds a
    dataclass input with `from_json` when the class has one; without it, unknown nested keys are
    dropped silently and "4096" or 4096.7 become 4096.
    """

    SECTION = ""

    @classmethod
    def from_json(cls, text: str, **_):
        try:
            return cls.from_mapping(json.loads(text))
        except SpecError as exc:
            import click  # only the CLI calls this: it prints a click error, one line a problem, no traceback

            raise click.BadParameter(str(exc)) from None

    @classmethod
    def from_mapping(cls, data: Any, section: str = "", elsewhere: Mapping[str, type] | None = None):
        """The section read from `data` (its keys, their types, then `check`), every problem in one SpecError;
        `section`: how the inputs spell where it came from (default `SECTION`); `elsewhere`: the workflow's other
        sections (name → class), where a key that is not a setting here is looked for."""
        problems, refused = section_problems(cls, section or cls.SECTION, data, elsewhere)
        if not problems.found:
            value = cls(**data)
            value.check()
            return value
        # The section's own checks still run on what reads (every refused or unknown key left at its default), so
        # that a refused value does not hide the problems across the others; a check that reads a refused setting
        # is not run.
        fields = {f.name for f in dataclasses.fields(cls)}
        with problems.check():
            cls(**{k: v for k, v in data.items() if k in fields and k not in refused}).check(skip=refused)
        problems.raise_if_any()

    def check(self, skip: Collection[str] = ()) -> None:
        """The checks that need only this section; `skip`: settings whose values were refused (left at their
        defaults here), which a check across settings must not read."""

    @classmethod
    def check_value(cls, key: str, name: str, value: Any) -> None:
        """One value given for the setting `name` (spelt `key` in messages), before the section is built: of its
        field's annotated type (bool, int, float, str). A section whose fields are training settings checks them as
        such (type and range)."""
        annotations = {f.name: f.type for f in dataclasses.fields(cls)}
        check_type(key, annotations[name], value)

    @classmethod
    def unknown_key(cls, section: str, key: object, elsewhere: Mapping[str, type]) -> str:
        """The message for `key`, not a setting of this section (`hints.not_a_setting`): a setting of another
        section (`elsewhere`) is pointed there, a misspelt one named."""
        return not_a_setting(section, key, cls, elsewhere)


def check_section(
    cls: type[StrictFromJson], section: str, data: Any, elsewhere: Mapping[str, type] | None = None
) -> None:
    """Reject unknown keys and wrongly typed values of one inputs section (a dataclass given as a mapping),
    every one of them in one SpecError (`section_problems`)."""
    section_problems(cls, section, data, elsewhere)[0].raise_if_any()


def section_problems(
    cls: type[StrictFromJson], section: str, data: Any, elsewhere: Mapping[str, type] | None = None
) -> tuple[Problems, set[str]]:
    """The unknown keys and refused values of one inputs section (a dataclass given as a mapping), and the keys of
    its settings whose values were refused. An unknown key is answered by the section (`unknown_key`; one that is a
    setting of another section, `elsewhere`, the workflow's other sections by name, is pointed there), a value checked
    by it (`check_value`). A section that is not a mapping is a SpecError."""
    if data is None:
        raise SpecError(
            f"{section} is null (is every setting under it commented out?): write its settings under it, or leave "
            f"{section.removesuffix('[]')} out for its defaults"
        )
    if not isinstance(data, dict):
        raise SpecError(f"{section} must be a mapping of settings, got {data!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    problems, refused = Problems(), set()
    for key, value in data.items():
        before = len(problems.found)
        with problems.check():
            if key not in names:
                raise SpecError(cls.unknown_key(section, key, elsewhere or {}))
            cls.check_value(f"{section}.{key}", key, value)
        if len(problems.found) > before and key in names:
            refused.add(key)
    return problems, refused
