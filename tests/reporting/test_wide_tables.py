"""The benchmark report's wide tables (every run, the environment, the loss parity) show their key columns first and
the rest behind a toggle, and the others' headers wrap: a page 1400 px wide shows every table without scrolling
sideways, and every column is still there, behind the toggle (and in the CSVs)."""

import dataclasses
import html
import json
import re

import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.parity import loss_parity
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.measuring.environment import RECORDED_PACKAGES
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult
from tests.workflows import browser

GIB = 1024**3
ENVIRONMENT = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_count": "8",
    "gpu_memory_bytes": str(80 * GIB),
    "driver": "580.159.04",
    "cuda": "13.0",
    "hostname": "a-rather-long-host-name-of-a-cluster-node-0123456789",
    **{package: "10.20.30+cu130.post4" for package in RECORDED_PACKAGES},
    "python": "3.11.7",
    "lock_sha256": "12ab43339895acd68ee9ca0f24045b651d0ea26c13166a7fa0712e6130544221",
}


def _analysis():
    experiment = ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[4, 8])
    planned = plan_runs(experiment, TrainingArgs(backend="plain_loop", max_seq_length=1024), n_runs=1)
    results = [
        RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok",
                  metrics={"tokens_per_second": 1000.0 + i, "peak_reserved_bytes": 40.0 * GIB, "final_loss": 2.5},
                  environment=ENVIRONMENT, details={"device": "cuda:0", "measured_at": "2026-11-26 14:00 UTC"})
        for i, run in enumerate(planned)
    ]  # fmt: skip
    a = analyze_grid(planned, results, {})
    steps = pd.DataFrame(
        [
            {"condition_id": run.condition_id, "run_number": 0, "step": step, "loss": 2.5,
             **{axis: getattr(run.training_args, axis) for axis in run.swept_axes}}
            for run in planned
            for step in range(4)
        ]
    )  # fmt: skip
    return dataclasses.replace(a, steps=steps, parity=loss_parity(steps, a.swept))


def _tables(html: str) -> list[list[str]]:
    """Every table's header cells, in page order (the toggle's tables included)."""
    return [re.findall(r"<th>(.*?)</th>", table) for table in re.findall(r"<table.*?</table>", html, re.DOTALL)]


def _compact_then_all(section: str, heading: str) -> tuple[list[str], list[str]]:
    """The table after `heading`: its shown columns and, behind the toggle that follows it, every column."""
    after = section.split(heading, 1)[1]
    shown, everything = _tables(after)[:2]
    assert re.search(r"</table></div><details class=\"columns\"><summary>[^<]*: all \d+ columns", after)
    return [h.replace("<wbr>", "") for h in shown], everything


def test_the_runs_table_shows_its_key_columns_and_every_column_behind_a_toggle():
    a = _analysis()
    runs = grid_report(a).sections["Runs"]
    shown, everything = _compact_then_all(runs, "<h3>Every run</h3>")
    assert shown[:4] == ["arm", "per_device_train_batch_size", "run_number", "status"]
    assert "tokens_per_second" in shown and "peak_reserved_gib" in shown and len(shown) <= 14
    assert len(everything) == len(a.table.columns) - 1  # every column but the error's tail (Conditions shows it)
    assert everything[: len(shown)] == shown


def test_the_environment_names_the_versions_first_and_the_rest_behind_a_toggle():
    summary = grid_report(_analysis()).sections["Summary"]
    shown, everything = _compact_then_all(summary, "<h3>Environment</h3>")
    assert shown == ["gpu_name", "gpu_count", "gpu_memory_gib", "driver", "cuda", "torch", "liger-kernel",
                     "transformers", "python"]  # fmt: skip
    assert "lock_sha256" in everything and "hostname" in everything and "datasets" in everything


def test_the_loss_parity_table_opens_with_its_verdict():
    loss_curves = grid_report(_analysis()).sections["Loss curves"]
    shown, everything = _compact_then_all(loss_curves, "<h3>Loss parity</h3>")
    assert shown[:3] == ["verdict", "arm", "per_device_train_batch_size"]
    assert "arm_condition_id" not in shown and "arm_condition_id" in everything
    assert everything[0] == "verdict"


# Measures, once the page has loaded, every table a reader sees without opening a toggle: how wide it is against
# the room it has.
_MEASURE = """<script>
window.addEventListener("load", () => {
  const out = [];
  for (const box of document.querySelectorAll("div.table")) {
    if (box.closest("details")) continue;
    out.push({section: box.closest("section").id, heading: (box.previousElementSibling || {}).textContent || "",
              scroll: box.scrollWidth, client: box.clientWidth});
  }
  const pre = document.createElement("pre"); pre.id = "widths"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def table_widths(page: str, tmp_path) -> list[dict]:
    """How wide each table a reader sees without opening a toggle is, in headless Chromium 1400 px wide, against the
    room it has: its section, what comes before it, `scroll` and `client` widths."""
    path = tmp_path / "widths.html"
    path.write_text(page.replace("<head>", "<head>" + _MEASURE, 1))
    completed = browser._run(["--window-size=1400,2000", "--virtual-time-budget=5000", "--dump-dom", path.as_uri()])
    (found,) = re.findall(r'<pre id="widths">(.*?)</pre>', completed.stdout, re.DOTALL)
    return json.loads(html.unescape(found))


needs_chromium = pytest.mark.skipif(browser.CHROMIUM is None, reason="needs headless Chromium")


@needs_chromium
def test_at_1400_px_no_table_scrolls_sideways(tmp_path):
    widths = table_widths(grid_report(_analysis()).to_html(), tmp_path)
    shown = {(w["section"], w["heading"].split(" ")[0]) for w in widths}
    wide = {("summary", "Environment"), ("runs", "Every"), ("loss-curves", "Each"), ("conditions", "Conditions")}
    assert wide <= shown
    assert [w for w in widths if w["scroll"] > w["client"]] == []  # no table a reader sees scrolls sideways
