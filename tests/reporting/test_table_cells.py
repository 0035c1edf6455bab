"""How the report's tables write a cell: a boolean as yes or no (never True or False), a number never in scientific
notation, a duration under a millisecond as "<0.001"; the tables the CSV and parquet files are written from keep their
values as they are. The GPU example report (its stored runs) writes no True, False or 3.16e-05 in a table, and its
How-sure table shows every ratio first, the rest behind a toggle."""

import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from finetune_bench.prediction.fine_tune import FineTune
from finetune_bench.reporting.benchmark_tabs.how_sure import COMPARED, how_sure_columns, how_sure_table
from finetune_bench.reporting.html import Report, compact_table_html, seconds_number, table_html, table_number
from tests.reporting.test_wide_tables import needs_chromium, table_widths

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "variable-length-llama1b-h200"


def _cells(fragment: str) -> list[str]:
    return re.findall(r"<td>(.*?)</td>", fragment)


def test_a_boolean_cell_is_yes_or_no_and_the_frame_keeps_its_booleans():
    frame = pd.DataFrame({
        "packing": [True, False],
        "significant": [np.True_, None],
        "reused": pd.array([False, pd.NA], dtype="boolean"),
        "note": ["True", "x"],  # a text that reads True stays as written
    })  # fmt: skip
    assert _cells(table_html(frame)) == ["yes", "yes", "no", "True", "no", "–", "–", "x"]
    assert frame["packing"].dtype == bool and frame["significant"].tolist() == [True, None]
    assert frame.to_csv(index=False).splitlines()[1] == "True,True,False,True"


def test_numbers_are_never_in_scientific_notation_and_seconds_under_a_millisecond_are_less_than_one():
    assert table_number(8.764e-05) == "0.00008764" and table_number(0.1165) == "0.1165"
    assert table_number(2.0) == "2" and table_number(14757.8) == "14,758" and table_number(-3.2e-05) == "-0.000032"
    assert seconds_number(3.16e-05) == "<0.001" and seconds_number(0.0) == "0" and seconds_number(0.00209) == "0.00209"
    assert seconds_number(23.53) == "23.53" and seconds_number(float("nan")) == "–"
    frame = pd.DataFrame({"store_s": [3.16e-05, np.nan], "max_rel_diff": [8.764e-05, 0.5], "step": [1, 2]})
    assert _cells(table_html(frame)) == ["&lt;0.001", "0.00008764", "1", "–", "0.5", "2"]


def test_a_table_shown_whole_may_wrap_its_headers():
    frame = pd.DataFrame({"new_shape_price_s": [0.12], "fine_tune_new_shape_steps": [243.2]})
    shown = compact_table_html(frame, list(frame.columns))
    assert '<div class="table compact">' in shown and "<th>new_<wbr>shape_<wbr>price_<wbr>s</th>" in shown
    assert "<details" not in shown


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The GPU example report rendered from its stored runs (`scripts/example_report.py`): its analysis and page."""
    spec = importlib.util.spec_from_file_location("example_report", ROOT / "scripts" / "example_report.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    directory = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE / "runs", directory / "runs")
    analysis = script.render(directory, FineTune(epochs=1), "Fine-tuning benchmark")
    return analysis, (directory / "report.html").read_text()


def test_the_example_report_writes_no_true_false_or_scientific_notation_in_its_tables(example):
    analysis, page = example
    cells = _cells(page)
    assert "True" not in cells and "False" not in cells and "yes" in cells and "no" in cells
    assert [cell for cell in cells if re.search(r"\de[-+]\d", cell)] == []
    timeline = page.split("<h3>Where the wall time went</h3>", 1)[1].split("</table>", 1)[0]
    assert _cells(timeline).count("&lt;0.001") == 4  # each condition's results-store lookup, some 30 µs
    # what the CSV and parquet files are written from is as measured
    assert analysis.table["reused"].dtype == bool and (analysis.table["store_s"] < 0.001).all()


def _paired() -> pd.DataFrame:
    """The most a How-sure table holds: three arms (an A/A one among them) at two points of two axes, five pairs each,
    every compared metric with its interval, test and noise floor, and long notes."""
    note = (
        "the throughput difference lies inside the A/A noise floor (±2.1%); the throughput difference is not "
        "significant at alpha 0.05"
    )
    rows = []
    for arm in ("liger", "baseline_repeat", "liger_fused_linear_cross_entropy"):
        for batch in (4, 16):
            row = {"arm": arm, "per_device_train_batch_size": batch, "max_seq_length": 4096, "pairs": 5, "note": note}
            for name, _ in COMPARED:
                row |= {f"{name}_ratio": 1.2345, f"{name}_ci_low": 1.1012, f"{name}_ci_high": 1.3123}
                row |= {f"{name}_p_value": 1.234e-05, f"{name}_significant": True, f"{name}_noise_floor": 0.0213}
            rows.append(row)
    return pd.DataFrame(rows)


def test_how_sure_shows_every_ratio_and_the_throughput_s_test_first_and_the_rest_behind_a_toggle():
    table = how_sure_table(_paired(), ["arm", "per_device_train_batch_size", "max_seq_length"])
    shown = how_sure_columns(table)
    assert shown[:4] == ["arm", "per_device_train_batch_size", "max_seq_length", "pairs"]
    assert [column for column in shown if column.endswith(" ×")] == [f"{label} ×" for _, label in COMPARED]
    assert {"throughput p", "throughput noise floor", "throughput significant", "note"} <= set(shown)
    assert "peak reserved memory p" not in shown and "peak reserved memory p" in table.columns


@needs_chromium
def test_at_1400_px_the_fullest_how_sure_table_does_not_scroll_sideways(tmp_path):
    table = how_sure_table(_paired(), ["arm", "per_device_train_batch_size", "max_seq_length"])
    page = Report({"Summary": compact_table_html(table, how_sure_columns(table), "how sure")}).to_html()
    (width,) = table_widths(page, tmp_path)
    assert width["scroll"] <= width["client"]
