"""What `pyflyte run` prints around a workflow of this project: each flag input declared once, and a local run's
short ending instead of a dump of its outputs.

flytekit declares a boolean input `--name/--no_name` and `--name/--no-name`, so click (8.2 and later) warns at every
start that `--name` "is used more than once" (`--force_fresh`, `--dry_run`, ...). `quiet_console` drops the repeated
name from each flag option as flytekit builds it; both negative spellings stay.

A local `pyflyte run` ends by echoing the workflow's outputs: the tables' pandas text and the temporary paths of the
report and its directory. `quiet_console` prints instead the report's own summary (`summary.txt`, written beside
each report by `tasks.analysis.publish`): its first lines, then `report:` and `results:` with the paths where the
files are (the export directory, `FINETUNE_BENCH_EXPORT_DIR`, when one is set). `FINETUNE_BENCH_VERBOSE=1` (`make
... VERBOSE=1`) or `pyflyte -v run ...` prints the outputs as flytekit does; the first also brings back datasets'
progress bars (saving the generated data, tokenizing it), which are off otherwise.
"""

import os
import sys
from pathlib import Path
from typing import Any

import click

from tasks.analysis import EXPORT_DIR_ENV, SUMMARY_FILE

VERBOSE_ENV = "FINETUNE_BENCH_VERBOSE"
DATASETS_PROGRESS_ENV = "HF_DATASETS_DISABLE_PROGRESS_BARS"
# The lines of SUMMARY_FILE that name a file of the report's directory.
PATH_KEYS = ("report", "results")


def verbose() -> bool:
    """Whether the full output was asked for: FINETUNE_BENCH_VERBOSE set to anything but "" or "0", or pyflyte's own
    `-v`."""
    if os.environ.get(VERBOSE_ENV, "") not in ("", "0"):
        return True
    context = click.get_current_context(silent=True)
    while context is not None:
        obj = context.obj
        level = obj.get("verbose") if isinstance(obj, dict) else getattr(obj, "verbose", None)
        if isinstance(level, int) and level > 0:
            return True
        context = context.parent
    return False


def ending_lines(outputs: Any) -> list[str] | None:
    """The console's ending for a workflow's outputs: the summary written beside its report, with each file's path
    where it is; None when the outputs have no report with a summary."""
    values = outputs if isinstance(outputs, tuple) else (outputs,)
    reports = [Path(v.path) for v in values if type(v).__name__ == "FlyteFile" and str(v.path).endswith(".html")]
    if not reports or not (reports[0].parent / SUMMARY_FILE).is_file():
        return None
    folder = reports[0].parent
    export = os.environ.get(EXPORT_DIR_ENV)
    if export and (Path(export) / reports[0].name).is_file():
        folder = Path(export)
    lines = []
    for line in (reports[0].parent / SUMMARY_FILE).read_text().splitlines():
        key, _, name = line.partition(": ")
        lines.append(f"{key}: {(folder / name).resolve()}" if key in PATH_KEYS and name else line)
    return lines


def _echo(message: Any = None, *args: Any, **kwargs: Any) -> None:
    """click.echo, except for a workflow's outputs (a local run's last words): their summary, unless verbose."""
    lines = None if isinstance(message, str | bytes) or message is None or verbose() else ending_lines(message)
    if lines is None:
        click.echo(message, *args, **kwargs)
    else:
        click.echo("\n".join(lines), *args, **kwargs)


class _RunClick:
    """click as flytekit's `run` module sees it: everything is click's, but `echo` is `_echo`."""

    echo = staticmethod(_echo)

    def __getattr__(self, name: str) -> Any:
        return getattr(click, name)


def _flag_declared_once(to_click_option: Any) -> Any:
    def to_option(*args: Any, **kwargs: Any) -> click.Option:
        option = to_click_option(*args, **kwargs)
        option.opts = list(dict.fromkeys(option.opts))
        option.secondary_opts = list(dict.fromkeys(option.secondary_opts))
        return option

    to_option.declared_once = True
    return to_option


def quiet_console() -> None:
    """Install both (idempotent): flag inputs declared once, and a local run's ending summary; and, unless
    `FINETUNE_BENCH_VERBOSE`, no progress bars of datasets (saving, mapping) in this process or its children."""
    from flytekit.clis.sdk_in_container import run

    if os.environ.get(VERBOSE_ENV, "") in ("", "0"):
        os.environ.setdefault(DATASETS_PROGRESS_ENV, "1")  # read when datasets is imported
        if "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()

    if not getattr(run.to_click_option, "declared_once", False):
        run.to_click_option = _flag_declared_once(run.to_click_option)
    if not isinstance(run.click, _RunClick):
        run.click = _RunClick()
