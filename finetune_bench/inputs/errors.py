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
    """` (did you mean 'x'?)` for the closest valid name other than `name` itself, or nothing; followed by what
    tells them apart when it cannot be seen (`invisible_difference`)."""
    others = [v for v in valid if v != name]
    match = difflib.get_close_matches(name, others, n=1, cutoff=0.5)
    if not match:  # a prefix or a fragment: `dataset` for `dataset_name`
        match = [v for v in others if v.startswith(name) or name in v][:1]
    return f" (did you mean {match[0]!r}?){invisible_difference(name, match[0])}" if match else ""


def invisible_difference(written: str, known: str) -> str:
    """What sets `written` apart from `known` when they look alike: spaces around it, or characters outside ASCII
    (a Cyrillic 'а', U+0430, for a Latin 'a') where `known` has others; "" when they differ visibly."""
    if not isinstance(written, str) or written == known:
        return ""
    if written.strip() == known:
        where = [
            side
            for side, spaced in (("before", written.lstrip() != written), ("after", written.rstrip() != written))
            if spaced
        ]
        return f"; {written!r} has {' and '.join(f'a space {side}' for side in where)} it"
    core = written.strip()
    if len(core) != len(known):
        return ""
    swapped = [(c, k) for c, k in zip(core, known, strict=True) if c != k]
    if not swapped or any(ord(c) < 128 for c, _ in swapped):
        return ""
    spelled = ", ".join(
        f"U+{ord(c):04X} ({unicodedata.name(c, 'unnamed')}) where {known!r} has {k!r}" for c, k in swapped
    )
    spaces = " and spaces around it" if core != written else ""
    return f"; {written!r} has {spelled}{spaces}"


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
