"""Render a benchmark report from stored runs: each run's record (result.json, as the results store keeps it) and its
steps (steps.csv), one directory a run under DIR/runs/. Writes DIR/report.html and, where a Chromium is at hand,
DIR/top.png (the first screen at 1,400 px). `make example-report` renders docs/examples/ this way, so that the GPU
example report in the docs is always the current renderer's.

    python scripts/example_report.py DIR [--fine-tune-steps N | --fine-tune-epochs E] [--title TITLE]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from finetune_bench.analysis.grid import GridAnalysis, analyze_grid  # noqa: E402
from finetune_bench.inputs.plan import PlannedRun  # noqa: E402
from finetune_bench.inputs.settings import TrainingArgs  # noqa: E402
from finetune_bench.prediction.fine_tune import FineTune  # noqa: E402
from finetune_bench.reporting.benchmark_report import grid_report  # noqa: E402
from finetune_bench.results.record import RankSummary, RunResult  # noqa: E402


def stored_runs(runs_dir: Path) -> tuple[list[PlannedRun], list[RunResult], dict[tuple[str, int], str]]:
    """The planned runs, their records and their steps files, from one directory a run."""
    planned, results, steps = [], [], {}
    for record_file in sorted(runs_dir.glob("*/result.json")):
        record = json.loads(record_file.read_text())
        record["training_args"] = TrainingArgs(**record["training_args"])
        record["ranks"] = [RankSummary(**rank) for rank in record.get("ranks", [])]
        result = RunResult(**record)
        result.steps_file, result.profile_dir = str(record_file.with_name("steps.csv")), ""
        results.append(result)
        steps[(result.condition_id, result.run_number)] = result.steps_file
        planned.append(PlannedRun(result.condition_id, result.run_number, result.training_args, result.swept_axes))
    if not results:
        raise SystemExit(f"no run under {runs_dir} (each run a directory with result.json and steps.csv)")
    return planned, results, steps


def render(directory: Path, fine_tune: FineTune, title: str) -> GridAnalysis:
    """Write directory/report.html from directory/runs/; the analysis it rendered."""
    analysis = analyze_grid(*stored_runs(directory / "runs"), fine_tune=fine_tune)
    (directory / "report.html").write_text(grid_report(analysis).to_html(title))
    return analysis


def screenshot(report: Path, image: Path) -> bool:
    """The report's first screen at 1,400 × 1,000 px as a PNG, by a headless Chromium; False where none is found."""
    browser = next(
        (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
    )
    if browser is None:
        return False
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
             "--window-size=1400,1000", f"--screenshot={image}", report.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--fine-tune-steps", type=int, default=0)
    parser.add_argument("--fine-tune-epochs", type=float, default=1.0)
    parser.add_argument("--title", default="Fine-tuning benchmark")
    args = parser.parse_args()
    render(args.directory, FineTune(args.fine_tune_epochs, args.fine_tune_steps), args.title)
    print(f"wrote {args.directory / 'report.html'}")
    if screenshot(args.directory / "report.html", args.directory / "top.png"):
        print(f"wrote {args.directory / 'top.png'}")
    else:
        print("no Chromium found: top.png not rendered")


if __name__ == "__main__":
    main()
