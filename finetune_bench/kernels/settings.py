"""What the kernel benchmark measures: which kernels, at which model's shapes, over which token counts.

Stdlib only (planning and validation need no torch). The kernels and their references live in
`finetune_bench.kernels.catalog`; `KERNELS` here is the single list of their names.
"""

from dataclasses import dataclass, field
from pathlib import Path

from finetune_bench.inputs.catalog import WHERE_PATHS_ARE_READ, architecture_config, architectures
from finetune_bench.inputs.errors import Problems, SpecError, closest
from finetune_bench.inputs.settings import StrictFromJson

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
MODES = ("forward", "backward", "full")
METRICS = {"speed": "ms", "memory": "MB"}
DTYPES = ("bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")


@dataclass
class KernelBenchmarkSettings(StrictFromJson):
    """One kernel benchmark: every kernel of `kernels` × provider × token count × mode."""

    SECTION = "sweep"

    def check(self) -> None:
        validate_kernel_settings(self)

    # Kernels to run (empty: all of them): rms_norm, layer_norm, rope, swiglu, geglu, cross_entropy,
    # fused_linear_cross_entropy, fused_add_rms_norm, dyt, relu_squared, kl_div.
    kernels: list[str] = field(default_factory=list)
    # Whose shapes (hidden size, MLP size, vocabulary, heads): a bundled architecture (`llama-3-8b`,
    # `qwen2.5-7b`, `phi-3-mini`, `mistral-7b`, `gemma-2-2b`, ...; the names `random:` takes).
    model: str = "llama-3-8b"
    # The sweep: tokens of one sequence (the x axis `T`) or rows of the flattened batch (`BT`).
    tokens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    # The inputs' dtype (the cross entropy's logits stay float32, as in Liger's own benchmark).
    dtype: str = "bfloat16"
    # The passes measured: forward, backward (of one forward's output), full (both).
    modes: list[str] = field(default_factory=lambda: list(MODES))
    # Also time and measure torch.compile of the reference (`torch_compile` provider).
    compile_reference: bool = False
    # triton.testing.do_bench's time budgets per point: warm-up and measurement, in milliseconds.
    warmup_ms: int = 25
    rep_ms: int = 100
    # `auto`: the GPU if there is one; on a CPU Liger's kernels run in the Triton interpreter (a check that
    # everything works; its timings mean nothing).
    device: str = "auto"
    # Seconds one kernel's whole sweep may take in its child process before it is killed.
    timeout_s: int = 1800
    # A CSV in Liger's benchmark-data format (its benchmark/data/all_benchmark_data.csv, or what its benchmark
    # scripts write when run on your GPU), local path or URL: the report sets each measured point beside the
    # row with the same kernel, provider, mode, metric and x value ("": no comparison).
    compare_with: str = ""


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


def validate_kernel_settings(settings: KernelBenchmarkSettings) -> None:
    """Every problem of the settings in one SpecError."""
    problems = Problems()
    key = KernelBenchmarkSettings.SECTION
    for name in settings.kernels:
        with problems.check():
            if name not in KERNELS:
                raise SpecError(
                    f"{key}.kernels: {name!r} is not a kernel here{closest(name, list(KERNELS))}; "
                    f"known: {list(KERNELS)}"
                )
    with problems.check():
        if settings.model not in architectures():
            raise SpecError(
                f"{key}.model: {settings.model!r} is not a bundled architecture"
                f"{closest(settings.model, architectures())}"
            )
    with problems.check():
        if not settings.tokens or any(not isinstance(t, int) or isinstance(t, bool) or t <= 0 for t in settings.tokens):
            raise SpecError(f"{key}.tokens must be a non-empty list of positive integers, got {settings.tokens!r}")
    with problems.check():
        if len(set(settings.tokens)) != len(settings.tokens):
            raise SpecError(f"{key}.tokens repeats a value: {settings.tokens!r}")
    for mode in settings.modes or [None]:
        with problems.check():
            if mode not in MODES:
                raise SpecError(f"{key}.modes: {mode!r} is not a mode; known: {list(MODES)}")
    with problems.check():
        if settings.dtype not in DTYPES:
            raise SpecError(f"{key}.dtype must be one of {list(DTYPES)}, got {settings.dtype!r}")
    with problems.check():
        if settings.device not in DEVICES:
            raise SpecError(f"{key}.device must be one of {list(DEVICES)}, got {settings.device!r}")
    with problems.check():
        local = settings.compare_with and "://" not in settings.compare_with
        if local and not Path(settings.compare_with).expanduser().is_file():
            raise SpecError(
                f"{key}.compare_with: {settings.compare_with!r} is not a file ({WHERE_PATHS_ARE_READ}, or a URL)"
            )
    for name in ("warmup_ms", "rep_ms", "timeout_s"):
        with problems.check():
            value = getattr(settings, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{key}.{name} must be a positive integer, got {value!r}")
    problems.raise_if_any()
