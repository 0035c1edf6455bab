"""YAML 1.1's traps: values PyYAML reads as something else than what was written, marked as they are read so that
the inputs can name them with their line and what to write instead.

- a zero-padded integer is octal (`032` is 26);
- digits joined by colons are a base-60 number (`1:30` is 90, `1:30:00` is 5400);
- in a flow list a comma separates items, so a number written with a thousands separator (`[1,024, 2048]`) or a
  decimal comma (`[2,0e-5]`) becomes two items, the second one maybe octal (`024` is 20) or text (`089`).

(`no`/`yes`/`on`/`off` read as booleans, and a thousands separator, a decimal comma or a leading zero outside a flow
list, read as text, are named where a string or a number is wanted: `rules.check_type`.) Installed on
`yaml.SafeLoader` when this module is imported (the workflow modules import it before the CLI reads a file): every
other value reads as before, a plain int, float or str.
"""

import re
from typing import Any

import yaml


class _Spelled:
    """A value read from a spelling that YAML 1.1 gives another meaning: the spelling, its line, and the digits and
    commas around it in a flow list when it is a part of one number written with commas (`1,024`), else ""."""

    spelled: str = ""
    line: int = 0
    joined: str = ""


class ZeroPaddedInteger(_Spelled, int):
    """An integer read from a zero-padded spelling (`032`, octal: 26)."""


class SexagesimalInteger(_Spelled, int):
    """An integer read from digits joined by colons (`1:30`, base 60: 90)."""


class SexagesimalFloat(_Spelled, float):
    """A float read from digits joined by colons (`1:30.5`, base 60: 90.5)."""


class ZeroPaddedText(_Spelled, str):
    """Text read from a zero-padded number that is not octal (`089`), an item of a number written with commas in a
    flow list (`[1,089]`)."""


_OCTAL = re.compile(r"[-+]?0[0-7_]+")
_ZERO_PADDED = re.compile(r"[-+]?0\d+")
# A number written with thousands separators (`1,024`, `1,048,576`).
THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+")
# A number's second half after a decimal comma in a flow list (`[2,0e-5]` is the items 2 and '0e-5'). Only with an
# exponent: plain digits there are read as an integer, so digits read as text were quoted on purpose (`[1, "2"]`).
_AFTER_DECIMAL_COMMA = re.compile(r"\d+[eE][-+]?\d+")


def _mark(cls: type, value: Any, node: yaml.ScalarNode) -> Any:
    marked = cls(value)
    marked.spelled, marked.line, marked.joined = str(node.value), node.start_mark.line + 1, _joined(node)
    return marked


def _joined(node: yaml.ScalarNode) -> str:
    """The digits and commas around `node` in the text read (`1,024` for the `024` of `[1,024, 2048]`), when it is
    joined by a comma to a number before or after it; "" otherwise, or when the text is not at hand (a stream)."""
    buffer, start, stop = node.start_mark.buffer, node.start_mark.pointer, node.end_mark.pointer
    if buffer is None:
        return ""

    def part_of_number(character: str) -> bool:
        return character.isdigit() or character == ","

    while start > 0 and part_of_number(buffer[start - 1]):
        start -= 1
    while stop < len(buffer) and part_of_number(buffer[stop]):
        stop += 1
    text = buffer[start:stop].strip(",")
    return text if text != node.value and "," in text else ""


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML 1.1's integer, marked when it was zero-padded (octal) or written in base 60."""
    value = loader.construct_yaml_int(node)
    if node.style is None and _OCTAL.fullmatch(str(node.value)):
        return _mark(ZeroPaddedInteger, value, node)
    if node.style is None and ":" in str(node.value):
        return _mark(SexagesimalInteger, value, node)
    return value


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    """YAML 1.1's float, marked when it was written in base 60."""
    value = loader.construct_yaml_float(node)
    if node.style is None and ":" in str(node.value):
        return _mark(SexagesimalFloat, value, node)
    return value


def _construct_str(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    """YAML 1.1's string, marked when it is a zero-padded number joined by a comma to another in a flow list (the
    `089` of `[1,089]`)."""
    value = loader.construct_yaml_str(node)
    if node.style is None and _ZERO_PADDED.fullmatch(value) and _joined(node):
        return _mark(ZeroPaddedText, value, node)
    return value


yaml.SafeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
yaml.SafeLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
yaml.SafeLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def yaml11_traps(data: Any, key: str = "") -> list[str]:
    """The values of an inputs file that YAML 1.1 read as something else than what was written, each named once
    with what to write instead."""
    problems: list[str] = []
    if isinstance(data, _Spelled) and data.joined:
        problems.append(_joined_message(key.rsplit("[", 1)[0], data))
    elif isinstance(data, ZeroPaddedInteger):
        problems.append(
            f"{key}: {data.spelled} (line {data.line}) is read by YAML 1.1 as the octal number {int(data)}; write "
            f"{int(data.spelled.replace('_', ''), 10)} without the leading zero, or quote it ('{data.spelled}') if "
            "text is meant"
        )
    elif isinstance(data, SexagesimalInteger | SexagesimalFloat):
        problems.append(
            f"{key}: {data.spelled} (line {data.line}) is read by YAML 1.1 as the base-60 number {data!r} (digits "
            f"joined by colons); write the number itself ({data!r}, e.g. seconds), or quote it ('{data.spelled}') if "
            "text is meant"
        )
    elif isinstance(data, dict):
        for name, value in data.items():
            problems += yaml11_traps(value, f"{key}.{name}" if key else str(name))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            previous = data[index - 1] if index else None
            joined = isinstance(value, _Spelled) and value.joined  # named as a whole with its parts, below
            if (
                isinstance(value, str)
                and _AFTER_DECIMAL_COMMA.fullmatch(value)
                and is_plain_int(previous)
                and not joined
            ):
                problems.append(
                    f"{key}: {previous}, {value!r} (items {index - 1} and {index}) look like one number with a decimal "
                    f"comma, which YAML reads as two items; write {previous}.{value}"
                )
            problems += yaml11_traps(value, f"{key}[{index}]")
    return list(dict.fromkeys(problems))  # the parts of one number written with commas are one problem


def _joined_message(key: str, part: _Spelled) -> str:
    """A number written with commas in a flow list, of which `part` (zero-padded) is an item: one message for all
    its items."""
    written = part.joined
    items = written.split(",")
    octal = "".join(f", and {item} is the octal number {int(item, 8)}" for item in items[1:] if _OCTAL.fullmatch(item))
    where = f"{key}: {written} (line {part.line}) is read by YAML 1.1 as {len(items)} items of the list"
    if THOUSANDS.fullmatch(written):
        return f"{where}, not one number (a comma separates items{octal}); write {''.join(items)} without the commas"
    separate = ", ".join(str(int(item)) for item in items)
    return (
        f"{where} (a comma separates items{octal}); write {items[0]}.{','.join(items[1:])} for one number with a "
        f"decimal comma, or [{separate}] for separate items"
    )


def is_plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
