"""How the tabs write a figure into a table cell or a sentence: with the digits that carry its information (a ratio
of 0.0012 is "×0.0012", never "×0.00"), and "–" where it was not computed (never "None" or "nan")."""

from collections.abc import Iterable

import pandas as pd

# One source for how a figure is written: the Summary's verdicts (analysis) and the kernel benchmark's use it too.
from finetune_bench.analysis.numbers import MISSING, number_text

__all__ = ["MISSING", "has_values", "number_text", "pairs_text", "percent_text", "ratio_text", "text_or_missing"]


def ratio_text(ratio: float, low: float, high: float) -> str:
    """A ratio to the baseline with its interval: "×1.20 [1.10, 1.30]"; "–" where there is no ratio."""
    if pd.isna(ratio):
        return MISSING
    interval = f" [{number_text(low)}, {number_text(high)}]" if pd.notna(low) and pd.notna(high) else ""
    return f"×{number_text(ratio)}{interval}"


def percent_text(share: float, sign: str = "") -> str:
    """A share as a percentage with at least one decimal and two significant digits: 0.031 → "3.1%", 0.0004 →
    "0.040%"; `sign` "+" writes the sign of a positive one too; "–" where it is missing."""
    if share is None or pd.isna(share):
        return MISSING
    text = number_text(100 * share, min_decimals=1)
    return f"+{text}%" if sign == "+" and share >= 0 else f"{text}%"


def pairs_text(pairs: Iterable[int]) -> str:
    """How many pairs the rows of a paired comparison have: "3 pairs", "1 pair", "2 to 5 pairs"."""
    counts = sorted({int(n) for n in pairs if pd.notna(n)})
    if not counts:
        return "no pairs"
    if len(counts) == 1:
        return f"{counts[0]} pair" + ("" if counts[0] == 1 else "s")
    return f"{counts[0]} to {counts[-1]} pairs"


def text_or_missing(value: object) -> str:
    """A text field of a run (its reason, its error) as written, "–" where it has none."""
    return MISSING if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def has_values(table: pd.DataFrame, column: str) -> bool:
    """Whether any row of `table` has a value in `column`."""
    return column in table and bool(table[column].notna().any())
