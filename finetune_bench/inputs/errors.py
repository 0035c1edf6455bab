"""The errors an input can cause, how several are reported at once, and the "did you mean" hint their
messages carry."""

import contextlib
import difflib
import unicodedata
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from finetune_bench.inputs.secrets import redact


class SpecError(ValueError):
    """Inputs that cannot be run; each problem names the offending key and value. One error can carry many
    problems (`problems`), so that a user sees every one at once."""

    def __init__(self, *problems: str):
        # A value that equals a secret of the environment (a token pasted into a setting) is never echoed.
        lines = [line for problem in problems for line in str(problem).splitlines() if line.strip()]
        self.problems = [_bounded(line) for line in redact(lines)]
        super().__init__(self._message())

    def _message(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0]
        return f"{len(self.problems)} problems in the inputs:\n" + "\n".join(f"- {p}" for p in self.problems)


# The most characters of one problem's line: a value echoed in full (a list of a million items from YAML aliases, a
# name of megabytes) is cut, so that every problem stays a line a user reads.
MAX_PROBLEM_CHARS = 2000


def _bounded(line: str) -> str:
    if len(line) <= MAX_PROBLEM_CHARS:
        return line
    return f"{line[:MAX_PROBLEM_CHARS]}… ({len(line) - MAX_PROBLEM_CHARS:,} more characters)"


class ConditionRefused(SpecError):
    """One condition of a valid grid that cannot run (e.g. a liger arm on a model type Liger cannot
    patch): it ends as an error result naming the reason, and the rest of the grid still runs."""


# What the benchmark does with a condition refused alone (`ConditionRefused`), said in its message.
NOT_RUN = "This condition is not run; the others are."


class Problems:
    """Collects the problems of several independent checks, so that all are reported together:

    problems = Problems()
    with problems.check():
        check_one(...)            # a SpecError here is kept, and the next check still runs
    problems.raise_if_any()       # one SpecError listing every problem
    """

    def __init__(self) -> None:
        self.found: list[str] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Run a check; keep its SpecError's problems instead of stopping (a refusal of one condition is not
        a problem of the inputs, and passes through)."""
        try:
            yield
        except ConditionRefused:
            raise
        except SpecError as error:
            self.found.extend(p for p in error.problems if p not in self.found)

    def raise_if_any(self) -> None:
        if self.found:
            raise SpecError(*self.found)


def closest(name: str, valid: list[str]) -> str:
    """` (did you mean 'x'?)` for the closest valid name other than `name` itself, followed by what tells them apart
    when it cannot be seen (`invisible_difference`); without a close name, the characters of `name` outside ASCII
    (`odd_characters`); or nothing."""
    others = [v for v in valid if v != name]
    match = difflib.get_close_matches(name, others, n=1, cutoff=0.5)
    if not match:  # a prefix or a fragment: `dataset` for `dataset_name`
        match = [v for v in others if v.startswith(name) or name in v][:1]
    if not match:
        return odd_characters(name)
    return f" (did you mean {match[0]!r}?){invisible_difference(name, match[0])}"


def invisible_difference(written: str, known: str) -> str:
    """What sets `written` apart from `known` when they look alike: spaces around it, characters outside ASCII (a
    Cyrillic 'а', U+0430, where `known` has a Latin 'a'), characters that do not show (U+200B ZERO WIDTH SPACE), each
    by code point and name; "" when they differ visibly and `written` is all ASCII."""
    if not isinstance(written, str) or written == known:
        return ""
    core = written.strip()
    where = [
        f"{_space(spaced)} {side}"
        for side, spaced in (
            ("before", written[: len(written) - len(written.lstrip())]),
            ("after", written[len(written.rstrip()) :]),
        )
        if spaced
    ]
    spaces = f" and {' and '.join(where)} it" if where else ""
    if core == known:
        return f"; {written!r} has {' and '.join(where)} it"
    if len(core) == len(known):
        swapped = [(c, k) for c, k in zip(core, known, strict=True) if c != k]
        if swapped and all(ord(c) >= 128 for c, _ in swapped):
            spelled = ", ".join(f"{_code_point(c)} where {known!r} has {k!r}" for c, k in swapped)
            return f"; {written!r} has {spelled}{spaces}"
    odd = odd_characters(core, written)
    if odd and where:
        return f"{odd}, and {' and '.join(where)} it"
    return odd or (f"; {written!r} has {' and '.join(where)} it" if where else "")


def odd_characters(text: str, shown: str | None = None) -> str:
    """`; 'text' has U+200B (ZERO WIDTH SPACE), which does not show`: every character of `text` outside ASCII, or
    one that does not show, by code point and name, in order, each once; "" when it has none. `shown`: the text
    the message quotes (default `text`)."""
    if not isinstance(text, str):
        return ""
    odd = [c for c in dict.fromkeys(text) if ord(c) >= 128 or not c.isprintable()]
    if not odd:
        return ""
    named = ", ".join(_code_point(c) + (", which does not show" if _hidden(c) else "") for c in odd)
    return f"; {text if shown is None else shown!r} has {named}"


def shown_name(name: object) -> str:
    """A key or name as a message shows it: quoted, with its escapes, when it has spaces around it or a character
    that does not show (`'max_\\u200bsteps'`); as written otherwise."""
    if isinstance(name, str) and (name != name.strip() or any(_hidden(c) for c in name)):
        return repr(name)
    return str(name)


def _hidden(character: str) -> bool:
    return not character.isprintable() or (character.isspace() and character != " ")


def _code_point(character: str) -> str:
    return f"U+{ord(character):04X} ({unicodedata.name(character, 'unnamed')})"


def _space(spaces: str) -> str:
    """Spaces before or after a word, as a message names them: `a space`, `2 spaces`, or by code point when other
    than ASCII's."""
    if set(spaces) == {" "}:
        return "a space" if len(spaces) == 1 else f"{len(spaces)} spaces"
    return " and ".join(_code_point(c) for c in spaces)


def refuse_spellings_of_one_value(key: str, values: list, canonical: Callable[[Any], Hashable], same: str) -> None:
    """A sweep's values that `canonical` makes one (two spellings of one value would train it twice under two names),
    every such pair in one SpecError: "`key`: 'a' and 'b' `same`; keep one". A value `canonical` refuses is refused
    on its own, not here."""
    seen: dict[Hashable, Any] = {}
    problems = []
    for value in values:
        try:
            one = canonical(value)
        except SpecError:
            continue
        if one in seen:
            problems.append(f"{key}: {seen[one]!r} and {value!r} {same}; keep one")
        seen.setdefault(one, value)
    if problems:
        raise SpecError(*problems)
