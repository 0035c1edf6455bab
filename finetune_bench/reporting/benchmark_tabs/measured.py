"""The Summary's first lines, "What was measured": the hardware, the training settings every run shared or swept,
the steps, when, and with which versions, from what the results table and the environment record carry (a piece
neither carries is left out, never guessed). The frontier, kernel and plan reports open with the same header
(`measured_html`), from what their own inputs carry."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.tables import ran_on_cpu
from finetune_bench.results.record import OK

# The packages the header names (the Environment table lists every recorded one).
HEADLINE_PACKAGES = ("liger-kernel", "torch", "transformers")


def values_text(values: pd.Series) -> str:
    """The distinct values of a column, in order ("1024", "1024, 2048"); "" when it has none."""
    distinct = {value for value in values.dropna() if str(value) != ""}
    return ", ".join(str(_whole(value)) for value in sorted(distinct, key=lambda v: (isinstance(v, str), v)))


def _whole(value: object) -> object:
    """A float that holds a whole number (a batch size in a float column) as that integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def settings_text(settings: list[object], name: str) -> str:
    """The distinct values of the setting `name` over `settings` (training settings, as `values_text` writes them)."""
    return values_text(pd.Series([getattr(each, name, None) for each in settings], dtype=object))


def span_text(values: pd.Series) -> str:
    """One number, or the smallest and the largest ("4", "2 to 4"); "" when there is none."""
    numbers = pd.to_numeric(values, errors="coerce").dropna()
    if numbers.empty:
        return ""
    low, high = int(numbers.min()), int(numbers.max())
    return str(low) if low == high else f"{low} to {high}"


def device_text(environment: dict[str, str], capacity_gib: float | None = None) -> str:
    """ "CPU (x86_64)" where an environment record says the device was a CPU, else its GPU with its memory ("" when
    it names neither)."""
    if environment.get("device_type") == "cpu" or (environment.get("cpu") and not environment.get("gpu_name")):
        return f"CPU ({environment['cpu']})" if environment.get("cpu") else "CPU"
    if not environment.get("gpu_name"):
        return ""
    return environment["gpu_name"] + (f" ({capacity_gib:.0f} GiB)" if capacity_gib else "")


def hardware_text(a: GridAnalysis, runs: pd.DataFrame) -> str:
    """ "CPU (x86_64)" for a CPU run, else the GPU, its memory and how many GPUs a run used."""
    if ran_on_cpu(a.table):
        return f"CPU ({a.environment['cpu']})" if a.environment.get("cpu") else "CPU"
    names = values_text(runs.get("gpu_name", pd.Series(dtype=str))) or a.environment.get("gpu_name", "")
    if not names:
        return ""
    memory = f" ({a.capacity_gib:.0f} GiB)" if a.capacity_gib else ""
    gpus = span_text(runs.get("world_size", pd.Series(dtype=float)))
    per_run = f", {gpus} GPU{'' if gpus == '1' else 's'} per run" if gpus else ""
    return f"{names}{memory}{per_run}"


def steps_text(runs: pd.DataFrame) -> str:
    """How many steps a run took and how many of them were timed ("4 per run, 3 of them timed")."""
    completed = runs.get("steps_completed", pd.Series(dtype=float))
    completed = span_text(completed[completed > 0])  # 0: the record does not say
    if not completed:
        return ""
    timed = span_text(runs.get("steps_measured", pd.Series(dtype=float)))
    return f"{completed} per run" + (f", {timed} of them timed" if timed else "")


def measured_at_text(runs: pd.DataFrame) -> str:
    """When the runs were measured: one time, or the first and the last ("" when no run says)."""
    times = sorted(t for t in runs.get("measured_at", pd.Series(dtype=str)).dropna().astype(str) if t)
    if not times:
        return ""
    return times[0] if times[0] == times[-1] else f"{times[0]} to {times[-1]}"


def versions_text(environment: dict[str, str]) -> str:
    """The headline packages' versions and the lockfile's hash, those the environment recorded."""
    parts = [f"{package} {environment[package]}" for package in HEADLINE_PACKAGES if environment.get(package)]
    if environment.get("lock_sha256"):
        parts.append(f"lockfile sha256 {environment['lock_sha256'][:12]}")
    return ", ".join(parts)


def what_was_measured(a: GridAnalysis) -> dict[str, str]:
    """Each known piece of what was measured, by its label, in reading order."""
    table = a.table
    runs = table[table["status"] == OK] if "status" in table else table
    runs = runs if not runs.empty else table
    pieces = {
        "hardware": hardware_text(a, runs),
        "model": values_text(runs.get("model_name", pd.Series(dtype=str))),
        "dataset": values_text(runs.get("dataset_name", pd.Series(dtype=str))),
        "backend": values_text(runs.get("backend", pd.Series(dtype=str))),
        "dtype": values_text(runs.get("dtype", pd.Series(dtype=str))),
        "sequence length": values_text(runs.get("max_seq_length", pd.Series(dtype=float))),
        "batch size per device": values_text(runs.get("per_device_train_batch_size", pd.Series(dtype=float))),
        "steps": steps_text(runs),
        "measured": measured_at_text(runs),
        "versions": versions_text(a.environment),
        "inputs file": a.environment.get("inputs_file", ""),
    }
    return {label: text for label, text in pieces.items() if text}


def measured_html(pieces: dict[str, str], title: str = "What was measured") -> str:
    """Known pieces (label → text, in reading order; an empty one is left out) as the header's short list ("" when
    none is known)."""
    items = "".join(f"<li>{html.escape(label)}: {html.escape(text)}</li>" for label, text in pieces.items() if text)
    return f'<div class="measured"><h3>{html.escape(title)}</h3><ul>{items}</ul></div>' if items else ""


def what_was_measured_html(a: GridAnalysis) -> str:
    """The header as a short list ("" when nothing is known)."""
    return measured_html(what_was_measured(a))
