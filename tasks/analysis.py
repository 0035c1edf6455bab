"""The analysis task: result records → results table, per-step table, Deck and HTML report."""

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
from flytekit import Deck, current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.reporting.benchmark_report import build_report
from finetune_bench.reporting.html import Report
from finetune_bench.results.record import RunResult
from images import analysis_image
from tasks.records import TrainOutput
from tasks.settings import ANALYSIS_RESOURCES

logger = logging.getLogger(__name__)
# Set (e.g. by `make demo`) to also copy the outputs to a local directory.
EXPORT_DIR_ENV = "FINETUNE_BENCH_EXPORT_DIR"


def unpack(outputs: list[TrainOutput | None]) -> tuple[list[RunResult | None], dict[tuple[str, int], str]]:
    """The train tasks' result records, and their per-step files downloaded, by (condition_id, run_number)."""
    results = [output.result if output is not None else None for output in outputs]
    steps_files = {
        (o.result.condition_id, o.result.run_number): o.steps.download() for o in outputs if o is not None and o.steps
    }
    return results, steps_files


def publish(
    report: Report, file_name: str, tables: dict[str, pd.DataFrame], title: str | None = None
) -> tuple[FlyteFile, FlyteDirectory]:
    """Show `report` as the task's Deck; write it as `file_name` beside `tables` (each as CSV and Parquet) in
    one directory, copied to the export directory when one is set. Returns the HTML file and the directory."""
    for name, content in report.sections.items():
        Deck(name, content)
    out_dir = Path(tempfile.mkdtemp(prefix="outputs-", dir=current_context().working_directory))
    report_path = out_dir / file_name
    report_path.write_text(report.to_html(title=title) if title else report.to_html())
    for name, table in tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
        table.to_parquet(out_dir / f"{name}.parquet", index=False)
    export = os.environ.get(EXPORT_DIR_ENV)
    if export:
        shutil.copytree(out_dir, export, dirs_exist_ok=True)
        logger.info("outputs exported to %s", export)
    return FlyteFile(str(report_path)), FlyteDirectory(str(out_dir))


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, enable_deck=True)
def analyze_results(
    planned: list[PlannedRun], outputs: list[TrainOutput | None], alpha: float
) -> tuple[pd.DataFrame, pd.DataFrame, FlyteFile, FlyteDirectory]:
    """Results table (one row per run), per-step table, the HTML report (the Deck shows it), and a directory
    with all three as files: report.html, results.parquet / .csv, steps.parquet / .csv."""
    analysis = analyze_grid(planned, *unpack(outputs))
    report = build_report(
        analysis.table, analysis.swept, analysis.environment, analysis.steps, analysis.parity, alpha=alpha
    )
    report_file, files = publish(report, "report.html", {"results": analysis.table, "steps": analysis.steps})
    return analysis.table, analysis.steps, report_file, files
