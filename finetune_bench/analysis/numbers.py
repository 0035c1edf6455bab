"""How a figure is written in a sentence or a table cell: with the digits that carry its information (a ratio of
0.0012 is "×0.0012", never "×0.00"), and "–" where it was not computed (never "None" or "nan"). The verdicts here,
the report's tabs and the kernel benchmark's summary all write their figures with these."""

import math

import pandas as pd

MISSING = "–"


def number_text(value: float, min_decimals: int = 2, significant: int = 2) -> str:
    """`value` with at least `min_decimals` decimals and at least `significant` significant digits: 1.2 → "1.20",
    0.0012 → "0.0012", 0.05 → "0.050"; "–" where it is missing."""
    if value is None or pd.isna(value):
        return MISSING
    if value == 0 or not math.isfinite(value):
        return f"{value:.{min_decimals}f}"
    decimals = max(min_decimals, significant - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def span_text(values: pd.Series) -> str:
    """The ratios of a set as "×1.20" (one value) or "×0.0024–0.12" (the smallest and the largest), each with the
    digits that carry it."""
    if len(values) == 1:
        return f"×{number_text(values.iloc[0])}"
    return f"×{number_text(values.min())}–{number_text(values.max())}"


def setting_text(axis: str, value: object) -> str:
    """One swept setting at one value, as an inputs file writes it: "packing true" (not "True"),
    "pad_to_multiple_of 64"."""
    return f"{axis} {str(value).lower() if isinstance(value, bool) else value}"
