"""How a setting declares its rules, and how values are checked against them: the rules of every inputs section
(`inputs.settings`, `frontier.settings`, `kernels.settings`).

A setting's rules live with its dataclass field (`setting(default, *rules)` and the helpers below), in the field's
metadata; `check_fields` applies them. A rule raises a SpecError naming the key it is given.
"""

import dataclasses
import difflib
import functools
import math
import re
from collections.abc import Callable, Collection
from dataclasses import field
from typing import Any

from finetune_bench.inputs.errors import Problems, SpecError, invisible_difference

Rule = Callable[[str, Any], None]
_RULES = "rules"
_PYTHON_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool}
# Integers travel through Flyte's literals as int64.
_INT64_MAX = 2**63 - 1


def setting(default: Any, *rules: Rule) -> Any:
    """A dataclass field with the plain value `default` (a list is copied for each instance) and the rules its
    values must pass, in order (the first a value fails is its problem)."""
    if isinstance(default, list):
        return field(default_factory=functools.partial(list, default), metadata={_RULES: rules})
    return field(default=default, metadata={_RULES: rules})


def requirement(holds: Callable[[Any], bool], requires: str) -> Rule:
    """A rule that refuses a value for which `holds` is false: `<key> <requires>, got <value>`."""

    def rule(key: str, value: Any) -> None:
        if not holds(value):
            raise SpecError(f"{key} {requires}, got {value!r}")

    return rule


def positive(default: float) -> Any:
    return setting(default, requirement(lambda v: v > 0, "must be positive"))


def non_negative(default: float, note: str = "") -> Any:
    """`note` follows "must not be negative" in the message, e.g. what 0 means."""
    return setting(default, requirement(lambda v: v >= 0, f"must not be negative{note}"))


def fraction(default: float) -> Any:
    return setting(default, requirement(lambda v: 0 <= v < 1, "must be in [0, 1)"))


def choice(default: Any, choices: Collection[Any]) -> Any:
    def rule(key: str, value: Any) -> None:
        if value not in choices:
            names = [c for c in choices if isinstance(c, str)]
            nearest = difflib.get_close_matches(value, names, n=1, cutoff=0) if isinstance(value, str) else []
            unseen = invisible_difference(value, nearest[0]) if nearest else ""
            raise SpecError(f"{key} must be one of {list(choices)}, got {value!r}{unseen}")

    return setting(default, rule)


def list_of(item: type, item_name: str, example: str) -> Rule:
    """A list-valued setting's shape (`check_list`): the rule that goes before the rules of its items."""

    def rule(key: str, value: Any) -> None:
        check_list(key, value, item, item_name, example)

    return rule


def check_list(
    key: str,
    value: Any,
    item: type | None,
    item_name: str = "items",
    example: str = "a, b",
    wrap: str = "{}",
    left_out: str = "for its default",
) -> None:
    """`value` a list whose items are each an `item` (any item when None), never a list or a mapping themselves;
    a list's usual slips named with what to write instead: null (every item commented out), a bare value (`kernels:
    rms_norm`), a mapping of on/off switches (`{rms_norm: false, swiglu: true}`: list the wanted names), a nested
    list. `item_name` names the items in the messages, `example` is a list's items as they are written; `wrap`
    spells one item from its name (`{{arm: {}}}` for a section's items); `left_out` what leaving the key out does."""
    name = key.rsplit(".", 1)[-1]
    if value is None:
        raise SpecError(
            f"{key} is null (is every item commented out?): write a list, e.g. {name}: [{example}], or leave "
            f"{name} out {left_out}"
        )
    if isinstance(value, dict):
        wanted = [str(k) for k, on in value.items() if on is True]
        listed = ", ".join(wrap.format(k) for k in wanted) or example
        raise SpecError(
            f"{key} must be a list, got the mapping {value!r}: list the wanted {item_name} instead "
            f"({name}: [{listed}]); one left out is not run"
        )
    if not isinstance(value, list):
        raise SpecError(f"{key} must be a list, got {value!r}: write {name}: [{wrap.format(value)}]")
    problems = []
    for index, element in enumerate(value):
        if isinstance(element, list) or (isinstance(element, dict) and item is not dict):
            shape = "a nested list" if isinstance(element, list) else "a mapping"
            problems.append(
                f"{key}[{index}] is {shape}, {_short_repr(element)}: write the {item_name} in one flat list, e.g. "
                f"{name}: [{example}]"
            )
        elif element is None:
            problems.append(
                f"{key}[{index}] is null (an item left empty, or its value commented out?): remove its line, or "
                f"write it, e.g. {name}: [{example}]"
            )
        elif item is dict and element == {}:
            problems.append(
                f"{key}[{index}] is an empty mapping (its settings commented out?): write it, e.g. "
                f"`- {wrap.format('<name>').removeprefix('{').removesuffix('}')}`, or remove its line"
            )
        elif item is dict and not isinstance(element, dict):
            one = wrap.format(element)  # `{arm: liger}`; in a block list `- arm: liger`
            block = one.removeprefix("{").removesuffix("}")
            problems.append(
                f"{key}[{index}] must be a mapping, got {element!r}: write `- {block}` (or {one} inside [...])"
            )
        elif item is not None and (not isinstance(element, item) or (isinstance(element, bool) and item is not bool)):
            hint = _number_as_text_hint(item.__name__, element.strip()) if isinstance(element, str) else ""
            problems.append(f"{key}[{index}] must be {item.__name__}, got {element!r}{hint}")
    if problems:
        raise SpecError(*problems)


def _short_repr(value: Any, limit: int = 120) -> str:
    """`repr(value)`, cut at `limit` characters (a nested list of YAML aliases can be millions of items)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"


def check_fields(settings: Any, section: str, names: Collection[str] | None = None, typed: bool = False) -> None:
    """Every field's rules (only those of `names`, when given), every problem in one SpecError, in field order.
    `typed`: each value is first checked against its field's annotation, for sections whose rules assume it."""
    problems = Problems()
    for f in dataclasses.fields(settings):
        if names is None or f.name in names:
            with problems.check():
                check_field(f, f"{section}.{f.name}", getattr(settings, f.name), typed)
    problems.raise_if_any()


def check_field(f: dataclasses.Field, key: str, value: Any, typed: bool = False) -> None:
    """One value of field `f`: its type when `typed` (a number also finite and within int64), then its rules."""
    if typed:
        check_value(key, f.type, value)
    for rule in f.metadata.get(_RULES, ()):
        rule(key, value)


def check_value(key: str, annotation: Any, value: Any) -> None:
    """`value` of the annotated type (bool, int, float, str), a number also finite and within int64: a setting's
    value, or a workflow's own input (`n_runs`, `alpha`, ...)."""
    check_type(key, annotation, value)
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{key} must be a finite number, got {value!r}")
    if is_integer(value) and abs(value) > _INT64_MAX:
        raise SpecError(f"{key} is too large (at most {_INT64_MAX:,}), got {value!r}")


def check_type(key: str, annotation: Any, value: Any) -> None:
    """`value` of the annotated type (bool, int, float, str; an int is a float, a bool is no number); a nested
    type is left to its own dataclass."""
    name = getattr(annotation, "__name__", str(annotation))
    python_type = _PYTHON_TYPES.get(name)
    if python_type is None:
        return
    if (isinstance(value, bool) and name != "bool") or not isinstance(value, python_type):
        hint = ""
        if name == "float" and isinstance(value, str) and _looks_like_float(value):
            # PyYAML (YAML 1.1) reads 2e-5 as a string: the float needs a dot in the mantissa.
            hint = f" (in YAML write {float(value)!r} or a mantissa with a dot, e.g. 2.0e-5)"
        elif name in ("float", "int") and getattr(value, "joined", ""):  # an item of `[1,089]`: `yaml11` names it
            hint = f" (an item of {value.joined}, which YAML reads as several)"
        elif name in ("float", "int") and isinstance(value, str):
            hint = _number_as_text_hint(name, value.strip())
        elif value is None:  # `key:` with nothing after it, or its value commented out
            hint = f" (left empty: write its value, or remove {key.rsplit('.', 1)[-1]} for its default)"
        elif name == "str" and isinstance(value, bool):
            words, example = ("yes, on or true", "yes") if value else ("no, off or false", "no")
            hint = f" (YAML 1.1 reads an unquoted {words} as {str(value).lower()}: quote it, e.g. '{example}')"
        raise SpecError(f"{key} must be {name}, got {value!r}{hint}")


# A number written with a decimal comma (`2,0e-5`): YAML reads it as a string, or in a flow list as two items.
_DECIMAL_COMMA = re.compile(r"[-+]?\d+,\d+([eE][-+]?\d+)?")
# With thousands separators (`1,024`, `1,048,576`), and zero-padded with an 8 or a 9 (`0128`: not octal, so text).
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+")
_ZERO_PADDED = re.compile(r"[-+]?0+(\d+)")


def _number_as_text_hint(name: str, text: str) -> str:
    """What to write for a number YAML read as text: one with a thousands separator, a decimal comma, a leading
    zero; "" for other text."""
    if _THOUSANDS.fullmatch(text):
        digits = text.replace(",", "")
        if name == "int":
            return f" (a thousands separator: write {digits})"
        if text.count(",") > 1:
            return f" (thousands separators: write {digits})"
        return f" (a thousands separator or a decimal comma: write {digits}, or {text.replace(',', '.')})"
    if _DECIMAL_COMMA.fullmatch(text):
        return f" (a decimal comma: write {text.replace(',', '.', 1)})"
    zero_padded = _ZERO_PADDED.fullmatch(text)
    if zero_padded:
        sign = "-" if text.startswith("-") else ""
        return f" (write {sign}{zero_padded.group(1)} without the leading zero)"
    return ""


def is_integer(value: Any) -> bool:
    """An int that is not a bool (YAML's and JSON's true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _looks_like_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where a setting acts: the conditions (a condition's TrainingArgs) for which `holds` is true, said in `where`.
    Set (not its default) in a grid where it acts in no condition, the setting would change nothing: refused
    (`inputs.validation.check_settings_act`)."""

    holds: Callable[[Any], bool]
    where: str


_SCOPE = "scope"


def acts_only(declared: Any, holds: Callable[[Any], bool], where: str) -> Any:
    """The setting field `declared` (`setting`, `positive`, ... or a plain default) declared to act only in the
    conditions where `holds(condition)`, described as `where` ("with LoRA (lora_rank above 0)")."""
    if not isinstance(declared, dataclasses.Field):
        declared = field(default=declared)
    kind = {"default": declared.default} if declared.default is not dataclasses.MISSING else {}
    if declared.default_factory is not dataclasses.MISSING:
        kind = {"default_factory": declared.default_factory}
    return field(**kind, metadata={**declared.metadata, _SCOPE: Scope(holds, where)})


# How `acts_everywhere` says where a setting acts.
EVERYWHERE = "in every condition"


def acts_everywhere(declared: Any) -> Any:
    """The setting field `declared` declared to act in every condition (what it sets changes every run): every
    setting declares where it acts, this or `acts_only`, so that a new one cannot slip through undeclared."""
    return acts_only(declared, lambda _: True, EVERYWHERE)


def field_scope(declared: dataclasses.Field) -> Scope | None:
    """Where the setting `declared` acts (`acts_only`, `acts_everywhere`); None: undeclared."""
    return declared.metadata.get(_SCOPE)


def undeclared(cls: type) -> list[str]:
    """The fields of the settings dataclass `cls` that declare no scope (`acts_only`, `acts_everywhere`)."""
    return [f.name for f in dataclasses.fields(cls) if field_scope(f) is None]


def acting_nowhere(
    cls: type,
    settings: Collection[Any],
    contexts: Collection[Any],
    key: Callable[[str], str],
    nowhere: str = "no condition of the grid qualifies",
) -> list[str]:
    """One problem per field of the settings dataclass `cls` that one of `settings` (its instances: a grid's
    conditions, or one section) sets (not its default) while its scope holds in none of `contexts` (what the scope
    is asked about: each condition, or what a workflow runs); `key(name)` spells a field in the message, `nowhere`
    says why nothing qualifies."""
    problems = []
    for declared in dataclasses.fields(cls):
        scope = field_scope(declared)
        if scope is None or not settings:
            continue
        default = declared.default if declared.default is not dataclasses.MISSING else declared.default_factory()
        values = []
        for instance in settings:
            value = getattr(instance, declared.name)
            if value not in values:
                values.append(value)
        if values == [default] or any(scope.holds(context) for context in contexts):
            continue
        shown = ", ".join(repr(value) for value in values if value != default)
        problems.append(
            f"{key(declared.name)} {shown} acts only {scope.where}, and {nowhere}, so it would change nothing; leave "
            f"it at its default ({default!r}) or set what it acts with"
        )
    return problems
