"""The errors an input can cause, and the "did you mean" hint their messages carry."""

import difflib


class SpecError(ValueError):
    """An input that cannot be run; the message names the offending key and value."""


class ConditionRefused(SpecError):
    """One condition of a valid grid that cannot run (e.g. a liger arm on a model type Liger cannot
    patch): it ends as an error result naming the reason, and the rest of the grid still runs."""


def closest(name: str, valid: list[str]) -> str:
    """` (did you mean 'x'?)` for the closest valid name, or nothing."""
    match = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if not match:  # a prefix or a fragment: `dataset` for `dataset_name`
        match = [v for v in valid if v.startswith(name) or name in v][:1]
    return f" (did you mean {match[0]!r}?)" if match else ""
