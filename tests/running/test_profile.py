"""`profile`: extra steps under torch.profiler after the timed ones, in every training backend; what they keep,
that they leave the timed steps alone, the store round trip, the report's Profile tab and the workflow's outputs.

Runs go through the real child-process launcher on the random-init tiny Llama (CPU, fp32): the profile is of
CPU operators there (no GPU kernels, no memory snapshot)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_table
from finetune_bench.analysis.tables import profile_categories, profile_table, results_table
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.profiling import (
    CATEGORY_NAMES,
    PROFILE_FILE,
    TRACE_FILE,
    attention_kernels_seen,
    category_of,
)
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import run_in_child

PROJECT_ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _run(tmp_path, dataset_dir, model_dir, name: str, **overrides):
    args = dataclasses.replace(TrainingArgs(), max_steps=STEPS, max_seq_length=48, **overrides)
    planned = PlannedRun(condition_id=name, run_number=0, training_args=args, swept_axes=[])
    result = run_in_child(planned, dataset_dir, model_dir, tmp_path / name, timeout_s=300)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    return result


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, tiny_dataset_dir, tiny_model_dir):
    tmp_path = tmp_path_factory.mktemp("profile")
    runs = {
        backend: _run(
            tmp_path, tiny_dataset_dir, tiny_model_dir, backend, backend=backend, profile=True, profile_steps=2
        )
        for backend in ("plain_loop", "hf_trainer", "trl_sft", "forward_only")
    }
    runs["unprofiled"] = _run(tmp_path, tiny_dataset_dir, tiny_model_dir, "unprofiled", backend="plain_loop")
    return runs


def test_every_backend_keeps_a_profile_of_its_extra_steps(profiled):
    for backend in ("plain_loop", "hf_trainer", "trl_sft", "forward_only"):
        result = profiled[backend]
        directory = Path(result.profile_dir)
        table = pd.read_csv(directory / PROFILE_FILE)
        assert not table.empty and set(table["category"]) <= set(CATEGORY_NAMES), backend
        assert table["share"].sum() == pytest.approx(1.0)
        assert (table["time_ms_per_step"] > 0).all()
        trace = json.loads((directory / TRACE_FILE).read_text())
        assert trace["traceEvents"], backend
        if backend != "forward_only":  # a training step multiplies matrices and steps an optimizer
            assert {"matmul", "optimizer"} <= set(table["category"]), (backend, set(table["category"]))
    assert profiled["unprofiled"].profile_dir == ""


def test_profiling_leaves_the_timed_steps_alone(profiled):
    """The profiled steps come after the timed ones: same number of recorded steps, the same losses step by step
    as an unprofiled run of the same settings."""
    with_profile = pd.read_csv(profiled["plain_loop"].steps_file)
    without = pd.read_csv(profiled["unprofiled"].steps_file)
    assert len(with_profile) == len(without) == STEPS
    assert with_profile["loss"].tolist() == without["loss"].tolist()
    assert profiled["plain_loop"].details["steps_completed"] == str(STEPS)


def test_the_store_keeps_the_profile_table(profiled, tmp_path):
    result = profiled["plain_loop"]
    store = ResultStore(str(tmp_path / "store"))
    assert store.save("key", result)
    loaded = store.load("key", tmp_path / "loaded")
    kept = Path(loaded.profile_dir) / PROFILE_FILE
    assert kept.read_bytes() == (Path(result.profile_dir) / PROFILE_FILE).read_bytes()
    assert not (Path(loaded.profile_dir) / TRACE_FILE).exists()  # the trace is not stored


def test_kernel_names_fall_in_their_categories():
    assert category_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert category_of("_rms_norm_forward_kernel") == "norms"
    assert category_of("_swiglu_forward_kernel") == "activations"
    assert category_of("liger_cross_entropy_kernel") == "loss/logits"
    assert category_of("flash_fwd_kernel") == "attention"
    assert category_of("multi_tensor_apply_kernel") == "optimizer"
    assert category_of("Memcpy DtoD (Device -> Device)") == "memory copies"
    assert category_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert category_of("void at::native::vectorized_elementwise_kernel<4, MulFunctor<c10::BFloat16>>") == (
        "elementwise (unattributed)"
    )
    assert category_of("something_new") == "other"
    # PyTorch's kernels carry `{lambda()#1}` in their template names: not the LAMB optimizer
    silu = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::"
        "TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
    )
    assert category_of(silu) == "activations"
    assert category_of("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda"
                       "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const>") == "memory copies"  # fmt: skip
    assert category_of("lamb_update_kernel") == "optimizer"


def test_the_attention_kernel_a_profile_saw_is_named_by_its_kernels():
    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"
    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false>>"
    efficient = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    assert attention_kernels_seen([gemm, cudnn, "softmax_warp_forward"]) == "cudnn"  # its name says flash too
    assert attention_kernels_seen([flash, "void pytorch_flash::flash_bwd_dq_dk_dv_loop_kernel<...>"]) == "flash"
    assert attention_kernels_seen([efficient, gemm]) == "efficient"
    assert attention_kernels_seen([gemm, "softmax_warp_forward", "softmax_warp_backward"]) == "none"  # math, eager
    assert attention_kernels_seen([flash, cudnn]) == "cudnn+flash"


def test_the_report_compares_arms_by_category(profiled):
    results, dirs = [], {}
    for arm, backend in (("liger", "plain_loop"), ("baseline", "hf_trainer")):
        result = dataclasses.replace(
            profiled[backend],
            condition_id=f"arm={arm}",
            training_args=dataclasses.replace(profiled[backend].training_args, arm=arm),
            swept_axes=["arm"],
        )
        results.append(result)
        dirs[(result.condition_id, 0)] = result.profile_dir
    profile = profile_table(results, dirs)
    categories = profile_categories(profile, ["arm"])
    assert set(categories["arm"]) == {"liger", "baseline"}
    planned = [
        PlannedRun(condition_id=r.condition_id, run_number=0, training_args=r.training_args, swept_axes=["arm"])
        for r in results
    ]
    table = results_table(planned, results)
    report = grid_report(analyze_table(table, ["arm"], {}, profile=profile))
    section = report.sections["Profile"]
    assert "liger − baseline" in section and "Top kernels" in section and "data:image/png;base64," in section
    assert "Profile" not in grid_report(analyze_table(table, ["arm"], {})).sections


# slow: a whole workflow with profiling (about two minutes on 2 cores); each backend's profile is tested above
@pytest.mark.slow
def test_the_workflow_exports_each_profile(tmp_path):
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text(
        "experiment_args:\n  arm: [baseline]\n  per_device_train_batch_size: [1]\n"
        "training_args:\n  backend: plain_loop\n  max_steps: 2\n  profile: true\n  profile_steps: 1\n"
    )
    export = tmp_path / "export"
    # W&B off (tests/integrations/test_wandb_logging.py is where its logging is checked): no W&B service to start
    env = dict(os.environ, FINETUNE_BENCH_EXPORT_DIR=str(export), WANDB_MODE="disabled")
    pyflyte = Path(sys.executable).parent / "pyflyte"
    completed = subprocess.run(
        [str(pyflyte), "run", "workflows/benchmark.py", "benchmarking_experiment", "--inputs-file", str(inputs)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (run_dir,) = (export / "profiles").iterdir()
    assert (run_dir / TRACE_FILE).exists() and (run_dir / PROFILE_FILE).exists()
    assert not pd.read_csv(export / "profile.csv").empty
    assert "Top kernels" in (export / "report.html").read_text()


def test_a_failed_profile_is_a_detail_of_the_run_not_its_end(tmp_path):
    import torch

    from finetune_bench.measuring.profiling import profile_after_training

    def step():
        raise RuntimeError("out of memory while recording the allocator's history\nmore")

    found = profile_after_training(step, 2, torch.device("cpu"), tmp_path / "profile")
    assert found == {"profile_error": "RuntimeError: out of memory while recording the allocator's history"}
    assert not (tmp_path / "profile" / PROFILE_FILE).exists()
    assert profile_after_training(lambda: None, 1, torch.device("cpu"), tmp_path / "ok") == {}
    assert (tmp_path / "ok" / PROFILE_FILE).exists()


def test_the_report_names_the_runs_whose_profile_failed(profiled):
    result = dataclasses.replace(
        profiled["unprofiled"], details={**profiled["unprofiled"].details, "profile_error": "OutOfMemoryError: CUDA"}
    )
    planned = [
        PlannedRun(condition_id=result.condition_id, run_number=0, training_args=result.training_args, swept_axes=[])
    ]
    table = results_table(planned, [result])
    assert table["profile_error"].tolist() == ["OutOfMemoryError: CUDA"] and table["status"].tolist() == ["ok"]
    section = grid_report(analyze_table(table, [], {})).sections["Profile"]
    assert "Profiles that failed" in section and "OutOfMemoryError: CUDA" in section
