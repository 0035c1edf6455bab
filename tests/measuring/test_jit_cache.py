"""The kernel caches' growth per step (`measuring.jit_cache`): where the CUDA driver and Triton keep their caches,
what a step added to them, and the outlier description that says so. Nothing is compiled for a GPU on this CPU: the
tests write files where the driver or Triton would; a GPU run checks the column against real first runs
(docs/measurements.md)."""

from pathlib import Path

import pandas as pd
import torch

from finetune_bench.measuring.jit_cache import (
    JitCacheGrowth,
    jit_cache_dir,
    jit_cache_text,
    kernel_cache_dirs,
    tree_bytes,
    triton_cache_dir,
)
from finetune_bench.measuring.steady_state import TimedStep, steady_state
from finetune_bench.measuring.steps import StepRecorder


def test_the_cache_is_where_the_driver_keeps_it_and_none_where_caching_is_off():
    assert jit_cache_dir({"CUDA_CACHE_PATH": "/cache/jit"}) == Path("/cache/jit")
    assert jit_cache_dir({}) == Path.home() / ".nv" / "ComputeCache"
    assert jit_cache_dir({"CUDA_CACHE_DISABLE": "1", "CUDA_CACHE_PATH": "/cache/jit"}) is None
    assert jit_cache_dir({"CUDA_CACHE_DISABLE": "0"}) == Path.home() / ".nv" / "ComputeCache"


def test_triton_s_cache_is_where_triton_keeps_it_and_both_caches_are_counted(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "cuda"))
    monkeypatch.delenv("CUDA_CACHE_DISABLE", raising=False)
    assert triton_cache_dir() == tmp_path / "triton"
    assert kernel_cache_dirs() == [tmp_path / "cuda", tmp_path / "triton"]
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")  # the driver's off: Triton's still counted
    assert kernel_cache_dirs() == [tmp_path / "triton"]
    growth = JitCacheGrowth()
    assert growth.start([tmp_path / "cuda", tmp_path / "triton"]) and growth.take() == 0
    (tmp_path / "triton" / "abc").mkdir(parents=True)
    (tmp_path / "triton" / "abc" / "kernel.cubin").write_bytes(b"x" * 30_000)  # a first run compiling Liger's kernel
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "index").write_bytes(b"y" * 100)
    assert growth.take() == 30_100
    (tmp_path / "triton" / "abc" / "kernel.cubin").unlink()  # one cache shrinking hides nothing the other added
    (tmp_path / "cuda" / "kernel").write_bytes(b"z" * 900)
    assert growth.take() == 900


def test_the_growth_is_what_was_added_since_the_last_take(tmp_path):
    root = tmp_path / "ComputeCache"
    growth = JitCacheGrowth()
    assert growth.take() is None  # not started: nothing counted, not zero
    assert growth.start([root]) and growth.take() == 0  # no cache yet is an empty one
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "kernel").write_bytes(b"x" * 1000)
    (root / "index").write_bytes(b"y" * 24)
    assert growth.take() == 1024
    assert growth.take() == 0
    (root / "a" / "b" / "kernel").unlink()  # evicted: the cache shrank, nothing added
    assert growth.take() == 0 and tree_bytes(root) == 24
    assert not JitCacheGrowth().start([])


def test_the_recorder_files_each_step_s_growth_and_an_outlier_says_it(tmp_path):
    cache = tmp_path / "cache"
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=1, steps_file=tmp_path / "steps.csv")
    recorder.begin_training()
    assert recorder.steps == [] and recorder._jit_cache.roots == ()  # a CPU run counts nothing
    recorder._jit_cache.start([cache])  # as a GPU run does
    for step in range(1, 12):
        recorder.add_batch(None, torch.zeros(2, 16, dtype=torch.long))
        if step in (1, 6):
            cache.mkdir(exist_ok=True)
            (cache / f"kernel-{step}").write_bytes(b"x" * 2_000_000)
        recorder.end_step()
        if step == 6:  # the step that compiled was ten times its expected time
            recorder.steps[-1].step_time_s = 10 * recorder.steps[0].step_time_s + 1.0
    with recorder.outside_steps():  # an evaluation that compiled: no step's
        (cache / "evaluation-kernel").write_bytes(b"x" * 500_000)
    recorder.add_batch(None, torch.zeros(2, 16, dtype=torch.long))
    recorder.end_step()
    recorder.end_training()
    steps = pd.read_csv(tmp_path / "steps.csv", keep_default_na=False)
    assert list(steps["jit_cache_bytes"]) == [2_000_000, 0, 0, 0, 0, 2_000_000, 0, 0, 0, 0, 0, 0]
    recorder.summary()
    assert any("step 6" in text and "kernel caches grew 2.0 MB" in text for text in recorder.outlier_descriptions)


def test_an_outlier_step_says_what_the_driver_compiled_beside_triton():
    steps = [TimedStep(i, 0.2, 8_000, 8_192, "8x1024", False) for i in range(6, 12)]
    steps[0] = TimedStep(6, 2.0, 7_900, 7_952, "8x994", True, compiled=jit_cache_text(4_300_000))
    _, described = steady_state(steps)
    assert described == [
        "step 6 (8x994, new shape): 2 s, expected 0.194 s (×10.3) [the kernel caches grew 4.3 MB (kernels compiled "
        "for this GPU the first time here)]"
    ]
    assert jit_cache_text(0) == jit_cache_text(None) == ""
