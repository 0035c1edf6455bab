"""Which Triton kernels a step compiled (`measuring.triton_compiles`): the counter on Triton's JIT hooks, the step
recorder's columns and figures, and the outlier description that names them. No kernel compiles on this CPU: the
hooks are called as Triton's JIT calls them (`JITFunction._do_compile`: the cache hook, then the post-compile hook
with the same key); a GPU run checks them against real compilations."""

import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from triton import knobs

from finetune_bench.measuring.steady_state import TimedStep, steady_state
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.measuring.triton_compiles import TritonCompileCounter, compilations_text, describe_kernels


def compile_a_kernel(name: str, seconds: float = 0.0, key: object = "i32:16") -> object:
    """What Triton's JIT does around one compilation, as far as its hooks see it (a new `JitFunctionInfo` for
    each call); the cache hook's answer (a truthy one would skip the compilation)."""
    hook = dict(key=key, repr=name, compile={}, is_manual_warmup=False, already_compiled=False)
    before, after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    answer = before(fn=SimpleNamespace(name=name, module="kernels"), **hook) if before else None
    time.sleep(seconds)
    if after:
        after(fn=SimpleNamespace(name=name, module="kernels"), **hook)
    return answer


@pytest.fixture
def no_hooks():
    saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_cache_hook = knobs.runtime.jit_post_compile_hook = None
    yield
    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved


def test_the_counter_counts_names_and_times_compilations_and_lets_them_happen(no_hooks):
    counter = TritonCompileCounter()
    assert counter.install()
    assert compile_a_kernel("liger_cross_entropy_kernel", seconds=0.02) is None  # the compilation is not skipped
    compile_a_kernel("element_mul_kernel")
    compile_a_kernel("liger_cross_entropy_kernel")
    n, seconds, kernels = counter.take()
    assert n == 3 and seconds >= 0.02
    assert kernels == "liger_cross_entropy_kernel×2, element_mul_kernel"
    # Inductor's kernels, compiled elsewhere, reach the post-compile hook with already_compiled: not counted
    knobs.runtime.jit_post_compile_hook(key="k", repr="", fn=SimpleNamespace(name="triton_poi_fused_0"), compile={},
                                        is_manual_warmup=False, already_compiled=True)  # fmt: skip
    assert counter.take() == (0, 0.0, "")  # taken once
    assert counter.install() and counter.installed  # a second install changes nothing (no hook calling itself)
    compile_a_kernel("rope_kernel")
    assert counter.take()[0] == 1
    assert counter.remove() is True and counter.remove() is None
    assert knobs.runtime.jit_cache_hook is None and knobs.runtime.jit_post_compile_hook is None
    compile_a_kernel("after_removal")
    assert counter.take() == (0, 0.0, "")


def test_hooks_installed_before_the_counter_are_still_called_and_put_back(no_hooks):
    calls = []
    knobs.runtime.jit_cache_hook = lambda **kw: calls.append(("before", kw["fn"].name)) or True
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(("after", kw["fn"].name))
    earlier = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    counter = TritonCompileCounter()
    counter.install()
    # the earlier cache hook's answer stands (here: skip the compilation)
    assert compile_a_kernel("rms_norm_kernel") is True
    assert calls == [("before", "rms_norm_kernel"), ("after", "rms_norm_kernel")]
    assert counter.take()[0] == 1
    counter.remove()
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == earlier


def test_the_recorder_files_each_step_s_compilations_and_the_run_s_total(tmp_path, no_hooks):
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=1, steps_file=tmp_path / "steps.csv")
    recorder.begin_training()
    for step in range(1, 6):
        recorder.add_batch(None, torch.zeros(2, 16, dtype=torch.long))
        if step in (1, 4):  # a warm-up compilation, and one in a measured step
            compile_a_kernel("cce_backward_kernel")
            compile_a_kernel("cce_backward_kernel")
        recorder.end_step()
    with recorder.outside_steps():
        compile_a_kernel("an_evaluation_kernel")  # outside the steps: no step's
    recorder.add_batch(None, torch.zeros(2, 16, dtype=torch.long))
    recorder.end_step()
    recorder.end_training()
    assert knobs.runtime.jit_post_compile_hook is None  # the recorder took its hooks out
    steps = pd.read_csv(tmp_path / "steps.csv", keep_default_na=False)
    assert list(steps["triton_compiles"]) == [2, 0, 0, 2, 0, 0]
    assert list(steps["triton_kernels_compiled"]) == ["cce_backward_kernel×2", "", "", "cce_backward_kernel×2", "", ""]
    summary = recorder.summary()
    assert summary["triton_compiles"] == 2  # the measured steps' (step 6 follows the evaluation: not measured)
    assert summary["triton_compile_s"] >= 0


def test_a_run_without_triton_s_hooks_has_no_compile_figures(monkeypatch):
    monkeypatch.setattr(TritonCompileCounter, "install", lambda self: False)
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    for _ in range(3):
        recorder.add_batch(None, torch.zeros(1, 8, dtype=torch.long))
        recorder.end_step()
    recorder.end_training()
    assert "triton_compiles" not in recorder.summary()  # not counted is not zero
    assert {(s.triton_compiles, s.triton_compile_s) for s in recorder.steps} == {(None, None)}


def test_an_outlier_step_says_what_it_compiled():
    steps = [TimedStep(i, 1.0, 8_000, 8_192, "4x2048", False) for i in range(4, 9)]
    compiled = compilations_text(12, 3.3, "cce_lse_forward_kernel×12")
    steps[0] = TimedStep(4, 4.5, 8_000, 8_192, "4x2048", False, compiled=compiled)
    _, described = steady_state(steps)
    assert described == [
        "step 4 (4x2048): 4.5 s, expected 1 s (×4.5) [Triton compiled 12 kernels in 3.30 s: cce_lse_forward_kernel×12]"
    ]
    assert compilations_text(0, 0.0, "") == ""
    assert compilations_text(1, 0.31, "k") == "Triton compiled 1 kernel in 0.31 s: k"
    assert compilations_text(2, 120.0, "") == "Triton compiled 2 kernels in 120.00 s"


def test_kernels_are_named_once_most_compiled_first():
    assert describe_kernels(["a", "b", "b", "c", "b"]) == "b×3, a, c"
    assert describe_kernels([]) == ""


def test_two_kernels_with_the_same_key_are_timed_apart(no_hooks):
    counter = TritonCompileCounter()
    counter.install()
    fn_a, fn_b = SimpleNamespace(name="a", module="m"), SimpleNamespace(name="b", module="m")
    hook = dict(key="same", repr="", compile={}, is_manual_warmup=False, already_compiled=False)
    knobs.runtime.jit_cache_hook(fn=fn_a, **hook)
    time.sleep(0.05)
    knobs.runtime.jit_cache_hook(fn=fn_b, **hook)
    knobs.runtime.jit_post_compile_hook(fn=fn_b, **hook)
    knobs.runtime.jit_post_compile_hook(fn=fn_a, **hook)
    n, seconds, _ = counter.take()
    assert n == 2 and seconds >= 0.05  # a's 0.05 s not lost to b's start
    counter.remove()


def test_no_counting_under_triton_s_interpreter_or_once_a_library_took_the_hooks(no_hooks, monkeypatch, tmp_path):
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    assert not TritonCompileCounter().install()  # the interpreter compiles nothing: no figure rather than 0
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    for _ in range(3):
        recorder.add_batch(None, torch.zeros(1, 8, dtype=torch.long))
        recorder.end_step()
    knobs.runtime.jit_post_compile_hook = lambda **kw: None  # as torch's symmetric memory sets its own
    recorder.end_training()
    recorder.end_training()
    assert "triton_compiles" not in recorder.summary()  # the counting stopped part-way: no figure
