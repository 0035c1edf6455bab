"""Which Triton kernels a step compiled, and how long that took: what explains a slow step that met no new shape.

Triton compiles a kernel again for every new specialisation of its arguments, not only for new shapes: an integer
argument is specialised on whether it is 1 and whether it divides by 16. Liger's cross entropy (`n_non_ignore`) and
Cut Cross-Entropy (`B`, the tokens it keeps, and `B_BIN`, its autotuning key) take the batch's count of labelled
tokens as such integers, and that count changes from batch to batch where prompts are masked, with every batch of
the same shape. On four GPUs at Llama-3-8B a step that compiled Liger's cross entropy again was 0.33 s slower, and
one that compiled Cut Cross-Entropy's three autotuned kernels again 3.3 s (docs/multi-gpu.md). The counter hooks
Triton's JIT (`triton.knobs.runtime.jit_cache_hook`, called before a compilation, and `jit_post_compile_hook`,
after it); a hook already installed is still called.
"""

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class TritonCompileCounter:
    """The Triton compilations since the last `take`, while installed: kernel names and seconds. The seconds are
    Triton's compilations (a kernel loaded from Triton's disk cache counts too, in milliseconds); an autotuner's
    benchmarking of the compiled configurations comes on top of them, in the step's time."""

    _names: list[str] = field(default_factory=list)
    _seconds: float = 0.0
    _started: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _knobs: object = None
    _previous: tuple = (None, None)

    @staticmethod
    def _compilation(key: object, fn: object) -> tuple[str, str, str]:
        # Triton's key is the arguments' specialisation and the options, the same for two kernels alike in both
        return str(getattr(fn, "module", "")), str(getattr(fn, "name", fn)), str(key)

    def before_compile(self, *, key: object, fn: object, **kwargs: object) -> object:
        self._started[self._compilation(key, fn)] = time.perf_counter()
        previous = self._previous[0]
        # a truthy answer would tell Triton to skip the compilation: only an earlier hook may give one
        return previous(key=key, fn=fn, **kwargs) if previous is not None else None

    def after_compile(self, *, key: object, fn: object, already_compiled: bool = False, **kwargs: object) -> object:
        # `already_compiled`: a kernel compiled elsewhere (Inductor's, when it is asked to call the hook) is no
        # compilation of this step's
        if not already_compiled:
            started = self._started.pop(self._compilation(key, fn), None)
            if started is not None:
                self._seconds += time.perf_counter() - started
            self._names.append(str(getattr(fn, "name", fn)))
        previous = self._previous[1]
        return previous(key=key, fn=fn, already_compiled=already_compiled, **kwargs) if previous is not None else None

    def install(self) -> bool:
        """Hook Triton's JIT; False where there is no Triton, no such hooks in it, or its interpreter runs the
        kernels (nothing is compiled): nothing is counted. Installing twice changes nothing."""
        if self.installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook") or getattr(runtime, "interpret", False):
            return False
        self._knobs = runtime
        self._previous = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        runtime.jit_cache_hook = self.before_compile
        runtime.jit_post_compile_hook = self.after_compile
        return True

    @property
    def installed(self) -> bool:
        """Whether both hooks are still this counter's (a library that replaced one since `install` stopped the
        counting: the figures are then not the run's)."""
        runtime = self._knobs
        return (
            runtime is not None
            and runtime.jit_cache_hook == self.before_compile
            and runtime.jit_post_compile_hook == self.after_compile
        )

    def remove(self) -> bool | None:
        """Put back the hooks found at `install` (ours only: a hook set since then stays); whether both were still
        ours (the counting whole), None when not installed."""
        runtime = self._knobs
        if runtime is None:
            return None
        whole = self.installed
        if runtime.jit_cache_hook == self.before_compile:
            runtime.jit_cache_hook = self._previous[0]
        if runtime.jit_post_compile_hook == self.after_compile:
            runtime.jit_post_compile_hook = self._previous[1]
        self._knobs = None
        return whole

    def take(self) -> tuple[int, float, str]:
        """The compilations since the last call: how many, their seconds, and the kernels' names ("name×N" for a
        kernel compiled N times, most compiled first)."""
        names, seconds = self._names, self._seconds
        self._names, self._seconds = [], 0.0
        return len(names), seconds, describe_kernels(names)


def describe_kernels(names: list[str]) -> str:
    """ "a×3, b" for names a, a, b, a: each kernel once, with its count where above one, most compiled first."""
    return ", ".join(name if n == 1 else f"{name}×{n}" for name, n in Counter(names).most_common())


def compilations_text(compiles: int, seconds: float, kernels: str) -> str:
    """A step's Triton compilations in words ("" for none): "Triton compiled 2 kernels in 0.31 s: a, b"."""
    if not compiles:
        return ""
    named = f": {kernels}" if kernels else ""
    return f"Triton compiled {compiles} kernel{'s' if compiles != 1 else ''} in {seconds:.2f} s{named}"
