"""The building blocks every report page shares: the page itself (sections that are also Deck tabs),
figures embedded as PNG, tables, and one colour per arm."""

import base64
import html
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.numbers import MISSING  # noqa: E402
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT  # noqa: E402

# How a table cell writes a boolean, and a duration too short to write in seconds.
YES, NO = "yes", "no"
SMALLEST_SECONDS = 0.001

# Fixed colours for the arms every experiment has; any other arm takes the next colour of tab10 not used here.
_FIXED_COLOURS = {BASELINE: "#4C72B0", BASELINE_REPEAT: "#8DA9D6", "liger": "#DD8452"}


@dataclass
class Report:
    """The report's sections, as HTML fragments, in display order (each a Deck tab), and its headline: the few
    plain-text lines a console ends with (the Summary's first line; `tasks.analysis.publish` writes them to
    summary.txt beside the report)."""

    sections: dict[str, str]
    headline: list[str] = field(default_factory=list)

    def to_html(self, title: str = "Fine-tuning benchmark") -> str:
        nav = " · ".join(f'<a href="#{_anchor(name)}">{html.escape(name)}</a>' for name in self.sections)
        body = "\n".join(
            f'<section id="{_anchor(name)}"><h2>{html.escape(name)}</h2>{content}</section>'
            for name, content in self.sections.items()
        )
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }}
.table {{ overflow-x: auto; max-width: 100%; }}
.compact th, .compact td {{ white-space: normal; }}
details.columns > summary {{ cursor: pointer; color: #245; margin: -1em 0 1em; }}
th {{ background: #f2f2f2; }}
.warning {{ background: #fff3cd; border: 1px solid #e0b000; padding: 0.8em; margin: 1em 0; }}
.verdict {{ font-size: 1.05em; font-weight: bold; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 1em; margin: 0.5em 0; }}
.card {{ border: 1px solid #bbb; border-radius: 6px; padding: 0.6em 1em; max-width: 100%; box-sizing: border-box; }}
.card-title {{ font-weight: bold; margin-bottom: 0.4em; }}
.card .figure {{ display: inline-block; margin: 0 1.6em 0.3em 0; vertical-align: top; }}
.big {{ display: block; font-size: 1.9em; font-weight: bold; white-space: nowrap; }}
.label {{ color: #555; font-size: 0.85em; }}
pre {{ background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }}
img {{ max-width: 100%; }}
nav {{ margin-bottom: 1em; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
<nav>{nav}</nav>
{body}
</body></html>"""


def _anchor(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())


def arm_order(arms: Iterable[str]) -> list[str]:
    """Baseline first, its A/A repeat next, then the other arms in the order they came."""
    arms = list(dict.fromkeys(arms))
    fixed = [arm for arm in (BASELINE, BASELINE_REPEAT) if arm in arms]
    return fixed + [arm for arm in arms if arm not in fixed]


def arm_palette(arms: Iterable[str]) -> dict[str, str]:
    """A distinct colour per arm; baseline, baseline_repeat and liger always get the same ones."""
    spare = iter(c for c in sns.color_palette("tab10").as_hex() if c.lower() not in ("#1f77b4", "#ff7f0e"))
    return {arm: _FIXED_COLOURS.get(arm) or next(spare) for arm in arm_order(arms)}


def figure_html(fig: plt.Figure, alt: str) -> str:
    """`fig` as an <img> with the PNG inline (the figure is closed)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}"/>'


def table_html(frame: pd.DataFrame) -> str:
    """`frame` as an HTML table that scrolls sideways when wide: a yes/no for True/False, a dash where a value is
    missing, numbers as `table_number` writes them and seconds (a column named `*_s`) as `seconds_number` does. Only
    the page's cells: the CSV and parquet exports keep the values as they are."""
    # nullable integers (a batch size that may be missing) print as numbers, and a missing one as a dash
    nullable = {c: float for c in frame.columns if str(frame[c].dtype) in ("Int64", "Float64")}
    frame = frame.astype(nullable) if nullable else frame
    # a missing value among other objects (a test not run beside True and False) is a dash too, never "None"
    texts = [
        i
        for i, dtype in enumerate(frame.dtypes)
        if str(dtype) == "object" or str(dtype).startswith("str") or pd.api.types.is_bool_dtype(dtype)
    ]
    if texts:
        frame = frame.copy()
        for i in texts:
            frame.isetitem(i, frame.iloc[:, i].map(_cell_text).astype(object))
    seconds = {
        column: seconds_number
        for column in frame.columns
        if str(column).endswith("_s") and pd.api.types.is_float_dtype(frame[column])
    }
    table = frame.to_html(
        index=False, float_format=table_number, formatters=seconds or None, na_rep=MISSING, border=0, escape=True
    )
    return f'<div class="table">{table}</div>'


def compact_table_html(frame: pd.DataFrame, first: Iterable[str], what: str = "the table") -> str:
    """A wide table as a page shows it: the columns of `first` that `frame` has, in that order (their headers may
    wrap, `wrapping_table_html`), then every column, those first, behind a toggle. A table with no other column is
    shown whole, its headers wrapping too."""
    shown = [column for column in dict.fromkeys(first) if column in frame.columns]
    ordered = frame[[*shown, *(column for column in frame.columns if column not in shown)]]
    if not shown:
        return table_html(ordered)
    if len(shown) == len(frame.columns):
        return wrapping_table_html(ordered)
    summary = f"{html.escape(what)}: all {len(frame.columns)} columns ({len(frame.columns) - len(shown)} more)"
    return (
        f'{wrapping_table_html(frame[shown])}<details class="columns"><summary>{summary}</summary>'
        f"{table_html(ordered)}</details>"
    )


def wrapping_table_html(frame: pd.DataFrame) -> str:
    """`frame` as a table whose headers may wrap at an underscore and whose text cells may wrap where they have
    spaces: many short figures under long column names that fit a page."""
    table = table_html(frame).replace('<div class="table">', '<div class="table compact">', 1)
    return re.sub(r"<th>(.*?)</th>", lambda m: "<th>" + m.group(1).replace("_", "_<wbr>") + "</th>", table)


def _missing(value: object) -> bool:
    """Whether a table cell holds no value: None, NaN, NA, or one of those written as text."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, str) and value in ("nan", "None", "<NA>")


def _cell_text(value: object) -> object:
    """A text or yes/no cell as a page shows it: a dash where it has no value, "yes" or "no" for a boolean (a test
    significant or not, packing on or off), any other value as it is."""
    if _missing(value):
        return MISSING
    if isinstance(value, bool | np.bool_):
        return YES if value else NO
    return value


def table_number(value: float) -> str:
    """A number as a table shows it: thousands separated, else 4 significant digits, never in scientific notation
    (0.00008764, not 8.764e-05)."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return np.format_float_positional(value, precision=4, unique=False, fractional=False, trim="-")


def seconds_number(value: float) -> str:
    """A duration in seconds as a table shows it: as `table_number` does, a dash where it is missing, and a positive
    one under a millisecond as "<0.001" (a results-store lookup of 30 µs, never "2.9e-05")."""
    if pd.isna(value):
        return MISSING
    return f"<{SMALLEST_SECONDS:g}" if 0 < value < SMALLEST_SECONDS else table_number(value)


def short_number(value: float) -> str:
    """A number as a figure label shows it: thousands separated, else 3 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def cards_html(cards: list[tuple[str, list[tuple[str, str]]]], note: str = "") -> str:
    """The answer at a glance: a card per subject (an arm against the baseline, a kernel), its title and its figures
    in large type, each with its label; `note` (HTML) under them says what the figures are. "" without a card."""
    if not cards:
        return ""
    body = "".join(
        f'<div class="card"><div class="card-title">{html.escape(title)}</div>'
        + "".join(
            f'<div class="figure"><span class="big">{html.escape(value)}</span><span class="label">'
            f"{html.escape(label)}</span></div>"
            for value, label in figures
        )
        + "</div>"
        for title, figures in cards
    )
    return f'<div class="cards">{body}</div>' + (f'<p class="label">{note}</p>' if note else "")
