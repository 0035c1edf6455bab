"""What the kernel benchmark measures: which kernels, at which model's shapes, over which token counts.

Stdlib only (planning and validation need no torch). The kernels and their references live in
`finetune_bench.kernels.catalog`; `KERNELS` here is the single list of their names.
"""

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_bench.inputs import software_sets as set_spelling
from finetune_bench.inputs.catalog import WHERE_PATHS_ARE_READ, architecture_config, architectures
from finetune_bench.inputs.errors import Problems, SpecError, closest
from finetune_bench.inputs.rules import (
    acting_nowhere,
    acts_everywhere,
    acts_only,
    check_fields,
    choice,
    is_integer,
    list_of,
    requirement,
    setting,
)
from finetune_bench.inputs.sections import StrictFromJson
from finetune_bench.sources import software

# The kernels benchmarked here, named as Liger's benchmark scripts name them (`kernel_name` in their data), each
# with its x axis: `T`, tokens of one sequence (batch 1), or `BT`, rows of a flattened batch.
KERNELS = {
    "rms_norm": "T",
    "layer_norm": "T",
    "rope": "T",
    "swiglu": "T",
    "geglu": "T",
    "cross_entropy": "BT",
    "fused_linear_cross_entropy": "BT",
    "fused_add_rms_norm": "T",
    "dyt": "T",
    "relu_squared": "T",
    "kl_div": "BT",
}
# Each kernel's reference, under the provider name Liger's benchmark data gives it.
REFERENCE_PROVIDERS = {
    "rms_norm": "huggingface",
    "layer_norm": "torch",
    "rope": "huggingface",
    "swiglu": "huggingface",
    "geglu": "huggingface",
    "cross_entropy": "torch",
    "fused_linear_cross_entropy": "torch",
    "fused_add_rms_norm": "torch",
    "dyt": "torch",
    "relu_squared": "torch",
    "kl_div": "torch",
}
LIGER, TORCH_COMPILE = "liger", "torch_compile"
# The largest token count of one point, and the most points a sweep may have.
MAX_TOKENS = 2**20
MAX_POINTS = 64
MODES = ("forward", "backward", "full")
# The calls a point is timed over on a CPU (`measure.speed_ms`: no triton.testing.do_bench there).
CPU_CALLS = 3
METRICS = {"speed": "ms", "memory": "MB"}
DTYPES = ("bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")


def _known_kernels(key: str, names: list[str]) -> None:
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        known = list(KERNELS)
        raise SpecError(
            *(f"{key}: {name!r} is not a kernel here{closest(name, known)}; known: {known}" for name in unknown)
        )
    _no_repeats(key, names)


def _no_repeats(key: str, values: list[str]) -> None:
    """A list of names each given once: a repeat would be run once (kernels) or measured twice (modes)."""
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise SpecError(f"{key} repeats {', '.join(repr(value) for value in repeated)}: list each once")


def _bundled_architecture(key: str, model: str) -> None:
    """A bundled architecture whose config names the shapes the kernels take (`model_shapes`): one that names them
    otherwise (GPT-2's n_embd, n_head) would end every point of the sweep as an error."""
    if model not in architectures():
        raise SpecError(f"{key}: {model!r} is not a bundled architecture{closest(model, architectures())}")
    missing = _missing_shapes(model)
    if missing:
        usable = [name for name in architectures() if not _missing_shapes(name)]
        model_type = architecture_config(model).get("model_type", "unknown")
        raise SpecError(
            f"{key}: {model!r} (model type {model_type!r}) has no {' / '.join(missing)} in its config, from which the "
            f"kernels take their shapes: every point would end as an error; use one of {usable}"
        )


def _missing_shapes(model: str) -> list[str]:
    """The config keys `model_shapes` needs that `model`'s bundled config lacks."""
    config = architecture_config(model)
    return [name for name in _SHAPE_KEYS if name not in config]


# The config keys every kernel's shapes come from (`model_shapes`; the rest have defaults).
_SHAPE_KEYS = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads")


def _token_counts(key: str, tokens: list[int]) -> None:
    problems = Problems()
    with problems.check():
        if not isinstance(tokens, list) or not tokens or any(not is_integer(t) or t <= 0 for t in tokens):
            raise SpecError(f"{key} must be a non-empty list of positive integers, got {tokens!r}")
    if problems.found:  # the checks below compare integers
        problems.raise_if_any()
    with problems.check():
        if len(set(tokens)) != len(tokens):
            raise SpecError(f"{key} repeats a value: {tokens!r}")
    with problems.check():
        if max(tokens) > MAX_TOKENS:
            raise SpecError(
                f"{key}: {max(tokens):,} tokens is more than {MAX_TOKENS:,} (2**20), the most one point may take: "
                "its inputs alone would not fit a GPU at a model's width"
            )
    with problems.check():
        if len(tokens) > MAX_POINTS:
            raise SpecError(
                f"{key}: {len(tokens):,} token counts, at most {MAX_POINTS} (each is a point of every sweep)"
            )
    problems.raise_if_any()


def _known_modes(key: str, modes: list[str]) -> None:
    unknown = [mode for mode in modes or [None] if mode not in MODES]
    if unknown:
        raise SpecError(*(f"{key}: {mode!r} is not a mode; known: {list(MODES)}" for mode in unknown))
    _no_repeats(key, modes)


def _software_sets(key: str, sets: list[str]) -> None:
    """Each set parses, and no two spell the same set (whether their releases exist is checked at planning)."""
    problems = Problems()
    for text in sets:
        with problems.check():
            set_spelling.check_syntax(key, text)
    with problems.check():
        set_spelling.check_sweep(key, sets)
    problems.raise_if_any()


def software_sets(settings: "KernelBenchmarkSettings") -> list[str]:
    """The sets each kernel runs under, in order: the installed packages when none is named."""
    return list(settings.software_sets) or [set_spelling.INSTALLED]


def check_software_sets_install(settings: "KernelBenchmarkSettings") -> None:
    """Each named set installs here and holds together with the installed packages (`software.check`), every
    problem at once; a set whose spelling is refused is left to the settings' own check."""
    software.check_all(settings.software_sets, "sweep.software_sets")


def _readable_source(key: str, source: str) -> None:
    if not source:
        return
    if "://" not in source and not Path(source).expanduser().is_file():
        raise SpecError(f"{key}: {source!r} is not a file ({WHERE_PATHS_ARE_READ}, or a URL)")
    check_benchmark_data(key, source)


# The columns of Liger's benchmark data that the comparison reads (its benchmark/data/all_benchmark_data.csv has
# these and more).
BENCHMARK_DATA_COLUMNS = (
    "kernel_name",
    "kernel_provider",
    "kernel_operation_mode",
    "metric_name",
    "metric_unit",
    "x_name",
    "x_value",
    "y_value_50",
    "gpu_name",
    "liger_version",
)


def check_benchmark_data(key: str, source: str) -> None:
    """A CSV in Liger's benchmark-data format (local path or fsspec URL): it can be read, has a header with every
    column of `BENCHMARK_DATA_COLUMNS`, at least one row, and a finite median (`y_value_50`) in every row (every
    measured row of this benchmark's own `kernel_rows`, whose `status` says which were). Read at
    planning, so that a file that cannot be compared is refused before any GPU time, not when the report is built."""
    import csv
    import math

    import fsspec  # reads a local path and a URL alike (it comes with flytekit)

    try:
        with fsspec.open(source, "r", newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [column for column in BENCHMARK_DATA_COLUMNS if column not in header]
            if missing:
                raise SpecError(
                    f"{key}: {source!r} is not Liger's benchmark data: "
                    + (
                        f"no column {missing} (it has {[name[:30] for name in header[:12]]})"
                        if header
                        else "it is empty"
                    )
                )
            rows, bad = 0, []
            for rows, row in enumerate(reader, start=1):
                if None in row or any(value is None for value in row.values()):
                    bad.append(f"line {rows + 1} has {'more' if None in row else 'fewer'} fields than the header")
                    continue
                if row.get("status", "ok") != "ok":  # a point of this benchmark's own rows that was not measured
                    continue
                try:
                    median = float(row["y_value_50"])
                except ValueError:
                    median = math.nan
                if not math.isfinite(median):
                    bad.append(f"line {rows + 1} has y_value_50 {row['y_value_50']!r}")
    except SpecError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error, ValueError, ImportError) as exc:
        raise SpecError(f"{key}: {source!r} cannot be read as a CSV ({type(exc).__name__}: {exc})") from None
    if not rows:
        raise SpecError(f"{key}: {source!r} has a header and no rows: nothing to compare with")
    if bad:
        more = f" (and {len(bad) - 3:,} more)" if len(bad) > 3 else ""
        raise SpecError(
            f"{key}: {source!r} has {len(bad):,} row(s) that cannot be compared: {'; '.join(bad[:3])}{more}; every row "
            "needs a finite y_value_50"
        )


def positive_integer(default: int) -> Any:
    return setting(default, requirement(lambda v: is_integer(v) and v > 0, "must be a positive integer"))


# The shortest kernel sweep timeout taken: a kernel's child process starts, imports torch and Triton and compiles its
# kernels before its first point (seconds on a GPU, more in Triton's interpreter on a CPU).
MIN_TIMEOUT_S = 30


def _timeout_floor(key: str, value: Any) -> None:
    if is_integer(value) and value < MIN_TIMEOUT_S:
        raise SpecError(
            f"{key} {value} is in seconds: every kernel's sweep would be killed before its first point; write at "
            f"least {MIN_TIMEOUT_S} (1800 is half an hour)"
        )


@dataclass(frozen=True)
class KernelWork:
    """What a sweep runs on, for the scopes of its settings (`rules.acts_only`): whether its kernels run on a GPU."""

    on_gpu: bool


# Where a setting acts that only a GPU's timing reads.
ON_A_GPU = (
    f"on a GPU (device cuda, or auto where a GPU is): on a CPU each point is timed over {CPU_CALLS} calls, whatever "
    "the budgets"
)


@dataclass
class KernelBenchmarkSettings(StrictFromJson):
    """One kernel benchmark: every kernel of `kernels` × provider × token count × mode."""

    SECTION = "sweep"

    def check(self, skip: Collection[str] = ()) -> None:
        check_fields(self, self.SECTION)  # a refused setting is left at its default, which holds
        problems = Problems()
        with problems.check():  # device cpu; device auto is decided where the sweep runs (`check_settings_act`)
            check_settings_act(self, gpu_here=True)
        with problems.check():
            if not {"kernels", "modes", "tokens", "device", "compare_with"} & set(skip):
                check_shares_a_point(self)
        problems.raise_if_any()

    # Kernels to run (empty: all of them): rms_norm, layer_norm, rope, swiglu, geglu, cross_entropy,
    # fused_linear_cross_entropy, fused_add_rms_norm, dyt, relu_squared, kl_div.
    kernels: list[str] = acts_everywhere(setting([], list_of(str, "kernel names", "rms_norm, swiglu"), _known_kernels))
    # Whose shapes (hidden size, MLP size, vocabulary, heads): a bundled architecture (`llama-3-8b`,
    # `qwen2.5-7b`, `phi-3-mini`, `mistral-7b`, `gemma-2-2b`, ...; the names `random:` takes).
    model: str = acts_everywhere(setting("llama-3-8b", _bundled_architecture))
    # The sweep: tokens of one sequence (the x axis `T`) or rows of the flattened batch (`BT`).
    tokens: list[int] = acts_everywhere(
        setting([1024, 2048, 4096, 8192], list_of(int, "token counts", "1024, 2048"), _token_counts)
    )
    # The inputs' dtype (the cross entropy's logits stay float32, as in Liger's own benchmark).
    dtype: str = acts_everywhere(choice("bfloat16", DTYPES))
    # The passes measured: forward, backward (of one forward's output), full (both).
    modes: list[str] = acts_everywhere(setting(list(MODES), list_of(str, "modes", "forward, full"), _known_modes))
    # Also time and measure torch.compile of the reference (`torch_compile` provider).
    compile_reference: bool = acts_everywhere(False)
    # triton.testing.do_bench's time budgets per point: warm-up and measurement, in milliseconds.
    warmup_ms: int = acts_only(positive_integer(25), lambda work: work.on_gpu, ON_A_GPU)
    rep_ms: int = acts_only(positive_integer(100), lambda work: work.on_gpu, ON_A_GPU)
    # `auto`: the GPU if there is one; on a CPU Liger's kernels run in the Triton interpreter (a check that
    # everything works; its timings mean nothing).
    device: str = acts_everywhere(choice("auto", DEVICES))
    # Seconds one kernel's whole sweep may take in its child process before it is killed.
    timeout_s: int = acts_everywhere(setting(1800, requirement(is_integer, "must be an integer"), _timeout_floor))
    # A CSV in Liger's benchmark-data format (its benchmark/data/all_benchmark_data.csv, or what its benchmark
    # scripts write when run on your GPU), local path or URL: the report sets each measured point beside the
    # row with the same kernel, provider, mode, metric and x value ("": no comparison).
    compare_with: str = acts_everywhere(setting("", _readable_source))
    # Liger releases (and other package releases) side by side: each a software set, package pins such as
    # "liger-kernel==0.8.2" ("" is the installed packages; see `finetune_bench.sources.software`). Every kernel's
    # sweep runs once per set, in a child that imports the set's releases; the report compares each set's Liger
    # kernel with the first set's. Empty: the installed packages only.
    software_sets: list[str] = acts_everywhere(
        setting([], list_of(str, "software sets", "'', liger-kernel==0.8.2"), _software_sets)
    )


def check_settings_act(sweep: KernelBenchmarkSettings, gpu_here: bool) -> None:
    """Refuse a sweep setting set where it acts in nothing the sweep runs (its scope, `KernelWork`): the time budgets
    on a CPU. `gpu_here`: whether device auto finds a GPU (a cluster's pods: true; a local run: this machine's)."""
    on_gpu = sweep.device == "cuda" or (sweep.device == "auto" and gpu_here)
    where = "device 'cpu'" if sweep.device == "cpu" else "device 'auto', and this machine has no GPU"
    found = acting_nowhere(
        KernelBenchmarkSettings,
        [sweep],
        [KernelWork(on_gpu)],
        lambda name: f"{sweep.SECTION}.{name}",
        f"the sweep runs on a CPU ({where})",
    )
    if found:
        raise SpecError(*found)


def check_shares_a_point(sweep: KernelBenchmarkSettings) -> None:
    """`compare_with`'s data has a row with the kernel, mode, metric, x axis and x value of a point the sweep measures
    (`report.against_published` matches on these): otherwise nothing would be compared, and the sweep's GPU time would
    buy no comparison. Read at planning, with the data's own checks (`check_benchmark_data`); a CPU measures no
    memory, so there only its speed rows count."""
    if not sweep.compare_with:
        return
    metrics = ["speed"] if sweep.device == "cpu" else list(METRICS)
    kernels = [name for name in KERNELS if not sweep.kernels or name in sweep.kernels]
    ours = {
        (kernel, mode, metric, KERNELS[kernel], float(tokens))
        for kernel in kernels
        for mode in sweep.modes
        for metric in metrics
        for tokens in sweep.tokens
    }
    theirs = benchmark_data_points(sweep.compare_with)
    if ours & theirs:
        return
    key = f"{sweep.SECTION}.compare_with"
    has = _points_text(theirs) or "no measured row with a numeric x value"
    raise SpecError(
        f"{key}: {sweep.compare_with!r} shares no point with the sweep (a point: kernel, mode, metric, x axis and x "
        f"value): it has {has}; the sweep measures {_points_text(ours)}; nothing would be compared: sweep the kernels, "
        "modes and token counts it has, or leave compare_with out"
    )


def _points_text(points: set[tuple]) -> str:
    """Points (kernel, mode, metric, x axis, x value) as a message says them: per kernel, its x axis and values, its
    modes and metrics (at most a few of each)."""

    def few(values: list) -> str:
        shown = [f"{v:g}" if isinstance(v, float) else str(v) for v in values[:6]]
        return ", ".join(shown) + (f" and {len(values) - 6} more" if len(values) > 6 else "")

    kernels = sorted({point[0] for point in points})
    parts = []
    for kernel in kernels[:4]:
        mine = [point for point in points if point[0] == kernel]
        xs = sorted({point[4] for point in mine})
        axes = "/".join(sorted({point[3] for point in mine}))
        modes = few(sorted({point[1] for point in mine}))
        metrics = few(sorted({point[2] for point in mine}))
        parts.append(f"{kernel} at {axes} {few(xs)} ({modes}; {metrics})")
    more = f" and {len(kernels) - 4} more kernels" if len(kernels) > 4 else ""
    return "; ".join(parts) + more


def benchmark_data_points(source: str) -> set[tuple]:
    """The points of the rows of Liger's benchmark data at `source` (read as `check_benchmark_data` reads it) that a
    comparison can use: measured (`status` ok, where the data has one), with a numeric x value; each as (kernel,
    mode, metric, x axis, x value)."""
    import csv

    import fsspec

    points = set()
    try:
        with fsspec.open(source, "r", newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if None in row or row.get("status", "ok") != "ok":
                    continue
                try:
                    x = float(row["x_value"])
                except (TypeError, ValueError):  # a model-config sweep names a model as x
                    continue
                points.add((row["kernel_name"], row["kernel_operation_mode"], row["metric_name"], row["x_name"], x))
    except (OSError, UnicodeDecodeError, csv.Error, KeyError) as exc:
        raise SpecError(f"compare_with: {source!r} cannot be read as a CSV ({type(exc).__name__}: {exc})") from None
    return points


def check_device_here(sweep: KernelBenchmarkSettings, gpu_names: list[str]) -> None:
    """A sweep on this machine (a local run), whose GPUs are `gpu_names`: `device: cuda` without one would start each
    kernel's child only for it to fail."""
    if sweep.device == "cuda" and not gpu_names:
        raise SpecError(
            f"{sweep.SECTION}.device 'cuda': this machine has no GPU that this local run could use; set device: auto "
            "(the Triton interpreter on a CPU: a check that everything runs, its timings meaningless) or run it on a "
            "GPU machine or a cluster"
        )


def providers(kernel: str, compile_reference: bool) -> list[str]:
    """Liger, its reference, and the compiled reference if asked for."""
    return [LIGER, REFERENCE_PROVIDERS[kernel], *([TORCH_COMPILE] if compile_reference else [])]


# Modules of liger_kernel/ops that hold helpers or a kernel's internals, not a kernel of their own.
_NOT_KERNELS = {"__init__", "utils", "configure", "_nvidia_shared", "fused_moe_kernels"}


def liger_kernels_shipped() -> list[str]:
    """The kernels the installed liger-kernel ships: its `liger_kernel/ops/<kernel>.py` modules, read from the
    package's files (nothing imported)."""
    import importlib.util

    package = importlib.util.find_spec("liger_kernel")
    if package is None or package.origin is None:
        raise ModuleNotFoundError("liger-kernel is not installed")
    ops = Path(package.origin).parent / "ops"
    return sorted(path.stem for path in ops.glob("*.py") if path.stem not in _NOT_KERNELS)


def kernels_not_benchmarked() -> list[str]:
    """The kernels liger-kernel ships that this benchmark has no case for."""
    return [name for name in liger_kernels_shipped() if name not in KERNELS]


def kernels_to_run(settings: KernelBenchmarkSettings) -> list[str]:
    """The kernels of `settings`, in `KERNELS` order (all of them when none is named)."""
    return [name for name in KERNELS if not settings.kernels or name in settings.kernels]


def model_shapes(model: str) -> dict[str, int]:
    """The sizes the kernels take from `model`'s bundled config."""
    config = architecture_config(model)
    heads = config["num_attention_heads"]
    return {
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
        "rope_theta": config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
    }
