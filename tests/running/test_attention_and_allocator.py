"""The `attention` and `allocator` settings in a training child: the kernel a run is pinned to runs (or the run
ends as an error naming why), the model loads with the attention transformers was asked for, every run records
both, and the child starts with the allocator options its settings name."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running import launch
from finetune_bench.running.allocator import (
    AllocatorMismatch,
    check_allocator,
    merged_alloc_conf,
    set_allocator,
)
from finetune_bench.running.backends.common import (
    ANY_LENGTH_ENV,
    AttentionNotRunnable,
    check_attention_runs_here,
    pinned_attention,
    set_cudnn_any_length,
)
from finetune_bench.running.launch import run_in_child

pytestmark = pytest.mark.usefixtures("undo_liger_patches")


def planned(**overrides) -> PlannedRun:
    args = dataclasses.replace(TrainingArgs(max_steps=2, timing_warmup_steps=1), **overrides)
    return PlannedRun(condition_id="test", run_number=0, training_args=args, swept_axes=[])


def child_run(tmp_path, tiny_dataset_dir, tiny_model_dir, name: str, **overrides):
    return run_in_child(planned(**overrides), tiny_dataset_dir, tiny_model_dir, tmp_path / name, timeout_s=300)


@pytest.mark.parametrize(
    ("backend", "attention", "implementation", "kernel"),
    [
        ("plain_loop", "math", "sdpa", "MATH"),
        ("plain_loop", "eager", "eager", "none (eager attention)"),
        ("hf_trainer", "math", "sdpa", "MATH"),
        ("plain_loop", "sdpa", "sdpa", "chosen by PyTorch per call"),
    ],
)
def test_a_cpu_run_trains_with_its_attention_and_records_it(
    tmp_path, tiny_dataset_dir, tiny_model_dir, backend, attention, implementation, kernel
):
    result = child_run(tmp_path, tiny_dataset_dir, tiny_model_dir, attention, backend=backend, attention=attention)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    assert result.details["attention"] == attention
    assert result.details["sdpa_kernel"] == kernel
    assert result.details["attn_implementation"] == implementation
    assert result.details["steps_completed"] == "2"
    assert result.details["cudnn_any_length"] == "off"


def test_the_any_length_switch_is_the_settings_own():
    env = {"PATH": "/bin"}
    assert set_cudnn_any_length(True, env) == f"on ({ANY_LENGTH_ENV}=1)"
    assert env == {"PATH": "/bin", ANY_LENGTH_ENV: "1"}
    # off removes one the launching environment exported: the run's attention is what its settings say
    env = {ANY_LENGTH_ENV: "1"}
    assert set_cudnn_any_length(False, env) == f"off ({ANY_LENGTH_ENV}='1' removed)"
    assert env == {}
    assert set_cudnn_any_length(False, env) == "off"


def test_a_cuda_only_kernel_resolved_on_a_cpu_ends_as_an_error_naming_it(tmp_path, tiny_dataset_dir, tiny_model_dir):
    # device auto passes planning; on this CPU machine it resolves to the CPU, where the kernel does not exist
    result = child_run(tmp_path, tiny_dataset_dir, tiny_model_dir, "efficient", attention="efficient")
    assert result.status == "error"
    assert result.reason == (
        "attention 'efficient' (PyTorch's EFFICIENT_ATTENTION kernel) runs on CUDA GPUs only, and this run's device "
        "is cpu"
    )
    assert result.details["attention"] == "efficient"


def _attention(query: torch.Tensor) -> torch.Tensor:
    output = F.scaled_dot_product_attention(query, query, query, is_causal=True)
    output.sum().backward()
    return output


def test_a_pinned_kernel_no_call_can_use_raises_naming_the_attention_not_falling_back(monkeypatch):
    monkeypatch.setattr("finetune_bench.running.backends.common.check_attention_runs_here", lambda *args: None)
    query = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(AttentionNotRunnable, match=r"^attention 'cudnn': PyTorch's CUDNN_ATTENTION kernel cannot run"):
        with pinned_attention("cudnn", torch.device("cpu"), torch.float32):
            _attention(query)


def test_the_pin_holds_for_the_backward_pass_and_is_lifted_after():
    query = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pinned_attention("math", torch.device("cpu"), torch.float32):
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        _attention(query)
    assert query.grad is not None and torch.isfinite(query.grad).all()
    assert torch.backends.cuda.flash_sdp_enabled()  # the global switch is restored


@pytest.mark.parametrize(
    ("attention", "dtype", "capability", "message"),
    [
        ("flash", torch.float32, (9, 0), r"takes \['float16', 'bfloat16'\] on a GPU, and this run's dtype is float32"),
        ("flash", torch.bfloat16, (7, 5), r"needs a GPU of compute capability 8\.0 or newer; .* has 7\.5"),
    ],
)
def test_flash_on_a_gpu_that_cannot_run_it_is_refused_before_loading(
    monkeypatch, attention, dtype, capability, message
):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(AttentionNotRunnable, match=message):
        check_attention_runs_here(attention, torch.device("cuda", 0), dtype)


def test_flash_on_an_ampere_gpu_in_bfloat16_passes_the_check(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    check_attention_runs_here("flash", torch.device("cuda", 0), torch.bfloat16)


# --- the allocator


@pytest.mark.parametrize(
    ("allocator", "inherited", "merged"),
    [
        ("expandable_segments", "", "expandable_segments:True"),
        ("default", "", ""),
        ("expandable_segments", "max_split_size_mb:128", "max_split_size_mb:128,expandable_segments:True"),
        ("default", "expandable_segments:True,max_split_size_mb:128", "max_split_size_mb:128"),
        ("expandable_segments", "expandable_segments:False", "expandable_segments:True"),
    ],
)
def test_the_runs_allocator_decides_expandable_segments_and_keeps_the_other_options(allocator, inherited, merged):
    assert merged_alloc_conf(allocator, inherited) == merged


def test_set_allocator_writes_every_name_the_environment_uses_and_reports_what_it_replaced():
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True,garbage_collection_threshold:0.8"}
    assert set_allocator(env, "default") == "expandable_segments:True"
    assert env == {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"}
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert set_allocator(env, "default") == "expandable_segments:True"
    assert env == {}  # no option left: no variable
    env = {}
    assert set_allocator(env, "expandable_segments") == ""
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.mark.parametrize("rank", [None, 1])  # a one-GPU run and a rank of a run on several GPUs start alike
def test_the_childs_environment_holds_the_runs_allocator(monkeypatch, rank):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    env = launch.child_env(planned(allocator="expandable_segments"), rank)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
    assert launch.child_env(planned(), rank)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"


def test_a_child_started_with_another_allocator_refuses_to_train():
    with pytest.raises(AllocatorMismatch, match=r"allocator is 'expandable_segments', and this process started with"):
        check_allocator("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    with pytest.raises(AllocatorMismatch, match="disagree"):
        check_allocator("default", {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "x:1"})
    check_allocator("default", {})


def test_the_child_records_the_allocator_options_it_started_with(
    tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # replaced by the run's `default`
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    default = child_run(tmp_path, tiny_dataset_dir, tiny_model_dir, "default", backend="plain_loop", max_steps=2)
    assert default.status == "ok", f"{default.reason}\n{default.error_tail}"
    assert default.details["alloc_conf"] == ""
    expandable = child_run(
        tmp_path, tiny_dataset_dir, tiny_model_dir, "expandable", backend="plain_loop", allocator="expandable_segments"
    )
    assert expandable.status == "ok", f"{expandable.reason}\n{expandable.error_tail}"
    assert expandable.details["alloc_conf"] == "expandable_segments:True"
    assert expandable.training_args.allocator == "expandable_segments"
