"""How the tabs write a figure into a table cell or a sentence."""

import pandas as pd


def ratio_text(ratio: float, low: float, high: float) -> str:
    """A ratio to the baseline with its interval: "×1.20 [1.10, 1.30]"; "–" where there is no ratio."""
    if pd.isna(ratio):
        return "–"
    interval = f" [{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else ""
    return f"×{ratio:.2f}{interval}"


def has_values(table: pd.DataFrame, column: str) -> bool:
    """Whether any row of `table` has a value in `column`."""
    return column in table and bool(table[column].notna().any())
