"""Which Triton kernels a step compiled, and how long that took: what explains a slow step that met no new shape.

Triton compiles a kernel again for every new specialisation of its arguments, not only for new shapes: an integer
argument is specialised on whether it is 1 and whether it divides by 16. Liger's cross entropy passes the batch's
count of non-ignored labels as such an integer, so the first batch whose count divides by 16 (or, after one that
did, the first that does not) compiles the kernel once more (a third of a second at Llama-3-8B's vocabulary), and
a kernel under `triton.autotune` (Cut Cross-Entropy's) benchmarks all its configurations again (seconds). The
counter hooks Triton's JIT (`triton.knobs.runtime.jit_cache_hook`, called before a compilation, and
`jit_post_compile_hook`, after it); a hook already installed is still called.
"""

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class TritonCompileCounter:
    """The Triton compilations since the last `take`, while installed: kernel names and seconds."""

    _names: list[str] = field(default_factory=list)
    _seconds: float = 0.0
    _started: dict[str, float] = field(default_factory=dict)
    _knobs: object = None
    _previous: tuple = (None, None)

    def before_compile(self, *, key: object, fn: object, **kwargs: object) -> object:
        self._started[str(key)] = time.perf_counter()
        previous = self._previous[0]
        # a truthy answer would tell Triton to skip the compilation: only an earlier hook may give one
        return previous(key=key, fn=fn, **kwargs) if previous is not None else None

    def after_compile(self, *, key: object, fn: object, **kwargs: object) -> object:
        started = self._started.pop(str(key), None)
        if started is not None:
            self._seconds += time.perf_counter() - started
        self._names.append(str(getattr(fn, "name", fn)))
        previous = self._previous[1]
        return previous(key=key, fn=fn, **kwargs) if previous is not None else None

    def install(self) -> bool:
        """Hook Triton's JIT; False where there is no Triton, or no such hooks in it (nothing is counted)."""
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        self._knobs = runtime
        self._previous = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        runtime.jit_cache_hook = self.before_compile
        runtime.jit_post_compile_hook = self.after_compile
        return True

    def remove(self) -> None:
        """Put back the hooks found at `install` (ours only: a hook set since then stays)."""
        runtime = self._knobs
        if runtime is None:
            return
        if runtime.jit_cache_hook == self.before_compile:
            runtime.jit_cache_hook = self._previous[0]
        if runtime.jit_post_compile_hook == self.after_compile:
            runtime.jit_post_compile_hook = self._previous[1]
        self._knobs = None

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
    """A step's Triton compilations in words ("" for none): "Triton compiled 2 kernels in 0.31 s (a, b)"."""
    if not compiles:
        return ""
    named = f" ({kernels})" if kernels else ""
    return f"Triton compiled {compiles} kernel{'s' if compiles != 1 else ''} in {seconds:.2g} s{named}"
