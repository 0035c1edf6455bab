"""The analysis task: result records → results table, per-step table, Deck and HTML report."""

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import click
import pandas as pd
from flytekit import Deck, current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.analysis.grid import GridAnalysis, analyze_grid
from finetune_bench.frontier.search import SEARCHES_FAILED
from finetune_bench.inputs.plan import PlannedRun, PredictionTarget, RunSettings
from finetune_bench.inputs.secrets import redact, secret_values
from finetune_bench.prediction.fine_tune import FineTune
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.reporting.html import Report
from finetune_bench.results.record import ERROR, NONFINITE, TIMEOUT, RunResult
from images import analysis_image
from tasks.execution import cluster_notes
from tasks.inputs_yaml import inputs_file_argument
from tasks.records import TrainOutput
from tasks.registration import ANALYSIS_RESOURCES, REGISTRATION_ENV

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


def profiles(outputs: list[TrainOutput | None]) -> dict[tuple[str, int], str]:
    """The profiled train tasks' profile directories, downloaded, by (condition_id, run_number)."""
    return {
        (o.result.condition_id, o.result.run_number): o.profile.download()
        for o in outputs
        if o is not None and o.profile is not None
    }


def publish(
    report: Report,
    file_name: str,
    tables: dict[str, pd.DataFrame],
    records: dict[str, dict],
    title: str | None = None,
    directories: dict[str, str] | None = None,
) -> tuple[FlyteFile, FlyteDirectory, list[str]]:
    """Show `report` as the task's Deck; write it as `file_name` beside `tables` (each as CSV and Parquet),
    its headline and where its files are (SUMMARY_FILE), `records` (each as JSON) and a copy of each of
    `directories` (name → local path; the profiles' traces and memory snapshots) in one directory, copied to the
    export directory when one is set. Returns the HTML file, the directory, and the problems of the export (a failed
    copy is one: the outputs stay in Flyte)."""
    # A setting equal to a secret of this environment (a token pasted where a name belongs) is never shown.
    secrets = secret_values()
    for name, content in report.sections.items():
        Deck(name, redact(content, secrets))
    out_dir = Path(tempfile.mkdtemp(prefix="outputs-", dir=current_context().working_directory))
    report_path = out_dir / file_name
    report_path.write_text(redact(report.to_html(title=title) if title else report.to_html(), secrets))
    for name, table in tables.items():
        table = without_secrets(table, secrets)
        table.to_csv(out_dir / f"{name}.csv", index=False)
        table.to_parquet(out_dir / f"{name}.parquet", index=False)
    for name, record in records.items():
        text = json.dumps(redact(record, secrets), indent=2, sort_keys=True, default=str)
        (out_dir / f"{name}.json").write_text(text)
    for name, path in (directories or {}).items():
        shutil.copytree(path, out_dir / name, dirs_exist_ok=True)
    (out_dir / SUMMARY_FILE).write_text(redact(summary_text(report, file_name, tables), secrets))
    problems = []
    export = os.environ.get(EXPORT_DIR_ENV)
    if export:
        try:
            shutil.copytree(out_dir, export, dirs_exist_ok=True)
            logger.info("outputs exported to %s", export)
        except OSError as exc:
            logger.error("the outputs could not be exported to %s: %s", export, exc)
            problems.append(f"export: the outputs could not be copied to {export} ({type(exc).__name__}: {exc})")
    return FlyteFile(str(report_path)), FlyteDirectory(str(out_dir)), problems


# Beside each report: its headline and where its files are, what a local `pyflyte run` ends with (workflows/console.py).
SUMMARY_FILE = "summary.txt"


def summary_text(report: Report, file_name: str, tables: dict[str, pd.DataFrame]) -> str:
    """The report's headline, then `report: <file_name>` and `results: <the first table>.csv` (names within the
    directory the files are written to)."""
    lines = [*report.headline, f"report: {file_name}"] + [f"results: {name}.csv" for name in list(tables)[:1]]
    return "\n".join(lines) + "\n"


def without_secrets(table: pd.DataFrame, secrets: list[str] | None = None) -> pd.DataFrame:
    """`table` with every secret value of the environment replaced in its text cells."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return table
    return table.map(lambda value: redact(value, secrets) if isinstance(value, str) else value)


def provenance(analysis: GridAnalysis, planned: list[PlannedRun]) -> dict:
    """Where and from what the tables came: the environment of the runs (GPU, driver, CUDA, versions, the
    lockfile's hash) and every condition's resolved settings, so that a table sent alone still says it."""
    conditions = {run.condition_id: dataclasses.asdict(run.training_args) for run in planned}
    return {"environment": analysis.environment, "swept_axes": analysis.swept, "conditions": conditions}


class AnalysisOutputs(NamedTuple):
    results: pd.DataFrame
    steps: pd.DataFrame
    report: FlyteFile
    files: FlyteDirectory
    # What left a measured run unstored, unlogged or unexported; `require_nothing_lost` fails the workflow on it.
    problems: list[str]


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def analyze_results(
    planned: list[PlannedRun],
    outputs: list[TrainOutput | None],
    execution: RunSettings,
    prediction: PredictionTarget,
) -> AnalysisOutputs:
    """Results table (one row per run), per-step table, the HTML report (the Deck shows it), a directory with
    them as files (report.html, results / comparison / steps / loss_parity / held_out_parity as .parquet and .csv,
    environment.json), and the problems that left a measured run unstored, unlogged or unexported. Each arm's test
    is at `execution.alpha`; with `prediction.gpu_hour_price`, each run's cost per million tokens is computed; on a
    cluster, the report also says what the execution does not keep (`results_store` empty, no W&B)."""
    profile_dirs = profiles(outputs)
    analysis = analyze_grid(
        planned,
        *unpack(outputs),
        profile_dirs=profile_dirs,
        alpha=execution.alpha,
        gpu_hour_price=prediction.gpu_hour_price,
        fine_tune=FineTune(prediction.fine_tune_epochs, prediction.fine_tune_steps),
    )
    if inputs_file_argument():  # a local run: the report and environment.json name the inputs file it was given
        analysis.environment["inputs_file"] = inputs_file_argument()
    report = grid_report(analysis, notes=cluster_notes(execution.results_store))
    tables = {
        "results": analysis.table,
        "comparison": analysis.paired,
        "steps": analysis.steps,
        "loss_parity": analysis.parity,
        "held_out_parity": analysis.held_out,
    }
    if not analysis.profile.empty:
        tables["profile"] = analysis.profile
    if not analysis.versions.empty:  # software sets: each against the reference set
        tables["versions"] = analysis.versions
    if not analysis.scaling.empty:  # runs on several GPUs
        tables["scaling"] = analysis.scaling
        tables["ranks"] = analysis.ranks
    report_file, files, export_problems = publish(
        report,
        "report.html",
        tables,
        {"environment": provenance(analysis, planned)},
        directories={f"profiles/{condition}-run{run}": path for (condition, run), path in profile_dirs.items()},
    )
    results, steps = without_secrets(analysis.table), without_secrets(analysis.steps)
    export = os.environ.get(EXPORT_DIR_ENV)
    report_at = str(Path(export) / "report.html") if export else "the execution's report output"
    ratio = success_ratio_problems(planned, unpack(outputs)[0], execution.min_success_ratio, report_at)
    return AnalysisOutputs(results, steps, report_file, files, analysis.problems + export_problems + ratio)


# How runs that count against `min_success_ratio` ended: an out-of-memory (or a predicted one) is a result, these
# are not; nor is a run whose task returned nothing.
FAILED_STATUSES = (ERROR, TIMEOUT, NONFINITE)
# The start of the problem `success_ratio_problems` gives, which `require_nothing_lost` says apart.
SUCCESS_RATIO_PROBLEM = "min_success_ratio"
# The most failed runs named one by one.
MAX_FAILURES_NAMED = 20


def success_ratio_problems(
    planned: list[PlannedRun], results: list[RunResult | None], min_success_ratio: float, report_at: str = ""
) -> list[str]:
    """One problem naming every failed run when fewer than `min_success_ratio` of the grid's runs succeeded (ended
    `ok`, out of memory, or predicted out of memory); none otherwise. `report_at`: where the report is."""
    if not planned:
        return []
    failures = []
    for run, result in zip(planned, results, strict=False):
        if result is None or result.status in FAILED_STATUSES:
            status = "no result" if result is None else result.status
            reason = "" if result is None else (result.reason or result.error_tail).strip().splitlines()[:1]
            failures.append(f"{run.condition_id} run {run.run_number}: {status}{': ' + reason[0] if reason else ''}")
    failures += [f"run {index}: no result" for index in range(len(results), len(planned))]
    succeeded = len(planned) - len(failures)
    if succeeded / len(planned) >= min_success_ratio:
        return []
    named = failures[:MAX_FAILURES_NAMED] + (
        [f"and {len(failures) - MAX_FAILURES_NAMED} more (the Runs tab lists them)"]
        if len(failures) > MAX_FAILURES_NAMED
        else []
    )
    return [
        f"{SUCCESS_RATIO_PROBLEM} {min_success_ratio}: {succeeded} of {len(planned)} runs succeeded "
        f"({succeeded / len(planned):.0%}); {len(failures)} ended error, timeout or nonfinite (a run out of memory "
        f"is a result and counts as one that succeeded; the report and every result were written"
        f"{': ' + report_at if report_at else ''}):\n" + "\n".join(f"  - {line}" for line in named)
    ]


class NothingKept(click.ClickException):
    """Measured runs were not stored, logged or exported, or too few runs succeeded: the workflow fails, naming
    each, after its outputs and report were written (a click error: the CLI prints the list without a traceback)."""


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, environment=REGISTRATION_ENV)
def require_nothing_lost(problems: list[str]) -> None:
    """Fail (a non-zero exit, a failed execution) when anything measured was not stored, logged or exported, or
    fewer runs succeeded than `min_success_ratio` asks (`success_ratio_problems`), or every search of a frontier
    failed (`frontier.search.failed_searches`)."""
    failed = (SUCCESS_RATIO_PROBLEM, SEARCHES_FAILED)  # what failed, not what was lost
    lost = [p for p in problems if not p.startswith(failed)]
    parts = [p for p in problems if p.startswith(failed)]
    if lost:
        parts.insert(
            0,
            f"{len(lost)} problem(s) kept measured results from being stored, logged or exported (the "
            "report and the tables were written and show them):\n" + "\n".join(f"- {p}" for p in lost),
        )
    if parts:
        raise NothingKept("\n".join(parts))
