"""What the kernel benchmark measures: which kernels, at which model's shapes, over which token counts.

Stdlib only (planning and validation need no torch). The kernels and their references live in
`finetune_bench.kernels.catalog`; `KERNELS` here is the single list of their names.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_bench.inputs.catalog import WHERE_PATHS_ARE_READ, architecture_config, architectures
from finetune_bench.inputs.errors import Problems, SpecError, closest
from finetune_bench.inputs.settings import StrictFromJson, check_fields, choice, is_integer, requirement, setting

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


def _known_kernels(key: str, names: list[str]) -> None:
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        known = list(KERNELS)
        raise SpecError(
            *(f"{key}: {name!r} is not a kernel here{closest(name, known)}; known: {known}" for name in unknown)
        )


def _bundled_architecture(key: str, model: str) -> None:
    if model not in architectures():
        raise SpecError(f"{key}: {model!r} is not a bundled architecture{closest(model, architectures())}")


def _token_counts(key: str, tokens: list[int]) -> None:
    problems = Problems()
    with problems.check():
        if not tokens or any(not is_integer(t) or t <= 0 for t in tokens):
            raise SpecError(f"{key} must be a non-empty list of positive integers, got {tokens!r}")
    with problems.check():
        if len(set(tokens)) != len(tokens):
            raise SpecError(f"{key} repeats a value: {tokens!r}")
    problems.raise_if_any()


def _known_modes(key: str, modes: list[str]) -> None:
    unknown = [mode for mode in modes or [None] if mode not in MODES]
    if unknown:
        raise SpecError(*(f"{key}: {mode!r} is not a mode; known: {list(MODES)}" for mode in unknown))


def _readable_source(key: str, source: str) -> None:
    if source and "://" not in source and not Path(source).expanduser().is_file():
        raise SpecError(f"{key}: {source!r} is not a file ({WHERE_PATHS_ARE_READ}, or a URL)")


def positive_integer(default: int) -> Any:
    return setting(default, requirement(lambda v: is_integer(v) and v > 0, "must be a positive integer"))


@dataclass
class KernelBenchmarkSettings(StrictFromJson):
    """One kernel benchmark: every kernel of `kernels` × provider × token count × mode."""

    SECTION = "sweep"

    def check(self) -> None:
        check_fields(self, self.SECTION)

    # Kernels to run (empty: all of them): rms_norm, layer_norm, rope, swiglu, geglu, cross_entropy,
    # fused_linear_cross_entropy, fused_add_rms_norm, dyt, relu_squared, kl_div.
    kernels: list[str] = setting([], _known_kernels)
    # Whose shapes (hidden size, MLP size, vocabulary, heads): a bundled architecture (`llama-3-8b`,
    # `qwen2.5-7b`, `phi-3-mini`, `mistral-7b`, `gemma-2-2b`, ...; the names `random:` takes).
    model: str = setting("llama-3-8b", _bundled_architecture)
    # The sweep: tokens of one sequence (the x axis `T`) or rows of the flattened batch (`BT`).
    tokens: list[int] = setting([1024, 2048, 4096, 8192], _token_counts)
    # The inputs' dtype (the cross entropy's logits stay float32, as in Liger's own benchmark).
    dtype: str = choice("bfloat16", DTYPES)
    # The passes measured: forward, backward (of one forward's output), full (both).
    modes: list[str] = setting(list(MODES), _known_modes)
    # Also time and measure torch.compile of the reference (`torch_compile` provider).
    compile_reference: bool = False
    # triton.testing.do_bench's time budgets per point: warm-up and measurement, in milliseconds.
    warmup_ms: int = positive_integer(25)
    rep_ms: int = positive_integer(100)
    # `auto`: the GPU if there is one; on a CPU Liger's kernels run in the Triton interpreter (a check that
    # everything works; its timings mean nothing).
    device: str = choice("auto", DEVICES)
    # Seconds one kernel's whole sweep may take in its child process before it is killed.
    timeout_s: int = positive_integer(1800)
    # A CSV in Liger's benchmark-data format (its benchmark/data/all_benchmark_data.csv, or what its benchmark
    # scripts write when run on your GPU), local path or URL: the report sets each measured point beside the
    # row with the same kernel, provider, mode, metric and x value ("": no comparison).
    compare_with: str = setting("", _readable_source)


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
