"""The Summary's first lines, "What was measured": the hardware, the model and its shape, the training settings
every run shared or swept, the steps, when, and with which versions and code, from what the results table, the
environment record and the model's config carry (a piece none of them carries is left out, never guessed). The
frontier, kernel and plan reports open with the same header (`measured_html`), from what their own inputs carry."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.tables import ran_on_cpu
from finetune_bench.inputs.errors import SpecError
from finetune_bench.measuring.environment import PROJECT
from finetune_bench.prediction.gpus import capped_gpu
from finetune_bench.prediction.shapes import NoPrediction, model_config
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
    if environment.get("gpu_memory_cap_gib"):  # capacity_gib is then the cap's
        return capped_gpu(environment["gpu_name"], environment["gpu_memory_cap_gib"]) + " (gpu_memory_cap_gib)"
    return environment["gpu_name"] + (f" ({capacity_gib:.0f} GiB)" if capacity_gib else "")


def hardware_text(a: GridAnalysis, runs: pd.DataFrame) -> str:
    """ "CPU (x86_64)" for a CPU run, else the GPU, its memory and how many GPUs a run used."""
    if ran_on_cpu(a.table):
        return f"CPU ({a.environment['cpu']})" if a.environment.get("cpu") else "CPU"
    names = values_text(runs.get("gpu_name", pd.Series(dtype=str))) or a.environment.get("gpu_name", "")
    if not names:
        return ""
    memory = f" ({a.capacity_gib:.0f} GiB)" if a.capacity_gib else ""
    if a.environment.get("gpu_memory_cap_gib"):  # a GPU of another size, emulated
        memory = f" capped to {float(a.environment['gpu_memory_cap_gib']):g} GiB (gpu_memory_cap_gib)"
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


def count_text(count: float) -> str:
    """A large count with three significant digits and its unit ("1.24B", "4.61M", "912")."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"


def _config_or_none(model_name: str, overrides: str) -> dict:
    """The model's config with the runs' overrides, where this package knows it (a bundled architecture, a local
    directory, a hub id a bundled architecture was copied from: `prediction.shapes.model_config`); {} elsewhere."""
    try:
        return model_config(model_name, overrides=overrides or "")
    except (NoPrediction, SpecError, OSError, ValueError):
        return {}


def model_shape_text(runs: pd.DataFrame) -> str:
    """Each distinct shape of the runs' model: its layers, hidden size and vocabulary from its config where it is
    known, and the parameters the runs counted (LoRA's adapters included) where they said ("16 layers, hidden 2,048,
    vocabulary 128,256, 1.24B parameters"); "" where neither is known."""
    if runs.empty or "model_name" not in runs:
        return ""
    overrides = runs.get("model_config_overrides", pd.Series("", index=runs.index)).fillna("").astype(str)
    shapes = []
    for (model, override), group in runs.groupby([runs["model_name"].astype(str), overrides], sort=False):
        config = _config_or_none(model, override)
        text = config.get("text_config") or config
        parts = [
            template.format(int(text[key]))
            for key, template in (
                ("num_hidden_layers", "{} layers"),
                ("hidden_size", "hidden {:,}"),
                ("vocab_size", "vocabulary {:,}"),
            )
            if isinstance(text.get(key), int)
        ]
        counted = group.get("num_parameters", pd.Series(dtype=float)).dropna()
        if not counted.empty:
            parts.append(f"{count_text(counted.median())} parameters")
        shapes.append(", ".join(parts))
    return "; ".join(dict.fromkeys(shape for shape in shapes if shape))


def code_text(environment: dict[str, str]) -> str:
    """This project's version and the git commit the runs' code came from, those the environment recorded."""
    parts = [f"{PROJECT} {environment[PROJECT]}"] if environment.get(PROJECT) else []
    if environment.get("code_commit"):
        parts.append(f"commit {environment['code_commit']}")
    return ", ".join(parts)


def what_was_measured(a: GridAnalysis) -> dict[str, str]:
    """Each known piece of what was measured, by its label, in reading order."""
    table = a.table
    runs = table[table["status"] == OK] if "status" in table else table
    runs = runs if not runs.empty else table
    pieces = {
        "hardware": hardware_text(a, runs),
        "model": values_text(runs.get("model_name", pd.Series(dtype=str))),
        "model shape": model_shape_text(runs),
        "dataset": values_text(runs.get("dataset_name", pd.Series(dtype=str))),
        "backend": values_text(runs.get("backend", pd.Series(dtype=str))),
        "dtype": values_text(runs.get("dtype", pd.Series(dtype=str))),
        "sequence length": values_text(runs.get("max_seq_length", pd.Series(dtype=float))),
        "batch size per device": values_text(runs.get("per_device_train_batch_size", pd.Series(dtype=float))),
        "steps": steps_text(runs),
        "measured": measured_at_text(runs),
        "versions": versions_text(a.environment),
        "code": code_text(a.environment),
        "inputs file": a.environment.get("inputs_file", ""),
    }
    return {label: text for label, text in pieces.items() if text}


# How many of the header's first pieces its folded line names (the hardware and the model, where known).
FOLDED_PIECES = 2


def measured_html(pieces: dict[str, str], title: str = "What was measured") -> str:
    """Known pieces (label → text, in reading order; an empty one is left out) as the header: folded to one line (the
    title and the first pieces), the whole list one click away ("" when none is known)."""
    known = {label: text for label, text in pieces.items() if text}
    if not known:
        return ""
    items = "".join(f"<li>{html.escape(label)}: {html.escape(text)}</li>" for label, text in known.items())
    line = "; ".join(list(known.values())[:FOLDED_PIECES])
    return (
        f'<div class="measured"><details><summary><b>{html.escape(title)}</b>: {html.escape(line)} (the details)'
        f"</summary><ul>{items}</ul></details></div>"
    )


def what_was_measured_html(a: GridAnalysis) -> str:
    """The header as a short list ("" when nothing is known)."""
    return measured_html(what_was_measured(a))
