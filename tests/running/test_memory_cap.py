"""A GPU of another size, emulated (`training_args.gpu_memory_cap_gib`): the fraction of the GPU torch is given, a cap
above the GPU refused by the run and by planning, and where results and reports say the cap."""

from types import SimpleNamespace

import pytest

from finetune_bench.analysis.tables import hardware_label
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction.gpus import GIB, capped_gpu, usable_bytes
from finetune_bench.prediction.grid import Target, predict_condition, shape_of
from finetune_bench.running.allocator import MemoryCapAboveGpu, cap_memory

H200_TORCH_TOTAL = 139.80 * GIB  # what torch reports of an H200's 143,771 MiB


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda as an H200 would answer; the fraction a run sets is recorded."""
    import torch

    given = {}
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=int(H200_TORCH_TOTAL))
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def set_fraction(fraction, device):
        if not isinstance(device, int):  # torch refuses a device without an index ("cuda")
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        given.update(fraction=fraction, device=device)

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    return given


def test_a_cap_gives_torch_what_a_gpu_of_that_size_leaves_it(fake_gpu):
    """79.6 GiB (an 80 GB H100): torch may reserve 79.6 less the CUDA context, 78.35 GiB, of the H200's 139.8."""
    fraction = cap_memory("cuda:0", 79.6)
    assert fake_gpu["fraction"] == fraction == pytest.approx(usable_bytes(79.6 * GIB) / H200_TORCH_TOTAL)
    assert fraction * H200_TORCH_TOTAL / GIB == pytest.approx(78.35, abs=0.01)


def test_a_cap_on_one_gpu_names_the_current_device(fake_gpu):
    """One process on one GPU trains on device "cuda", without an index: the cap goes to GPU 0, not a ValueError."""
    cap_memory("cuda", 40)
    assert fake_gpu["device"] == 0
    cap_memory("cuda:1", 40)
    assert fake_gpu["device"] == 1


def test_a_cap_above_the_gpu_is_an_error_naming_the_setting(fake_gpu):
    with pytest.raises(MemoryCapAboveGpu, match=r"gpu_memory_cap_gib 200 emulates a GPU larger than this one"):
        cap_memory("cuda:0", 200)
    assert "fraction" not in fake_gpu  # nothing was set


def test_results_and_reports_name_the_cap_with_the_gpu():
    assert hardware_label("cuda:0", "NVIDIA H200", "79.6") == "gpu: NVIDIA H200 capped to 79.6 GiB"
    assert hardware_label("cuda:0", "NVIDIA H200", "") == "gpu: NVIDIA H200"
    assert hardware_label("cpu", "", "79.6") == "cpu"
    assert capped_gpu("H100", 0) == "H100"


def test_the_plan_predicts_against_the_emulated_gpu():
    """Llama-3.2-1B at batch 16 × 2,048: fits an H200, not an H200 capped to a 40 GB A100's memory."""
    args = TrainingArgs(
        model_name="random:llama-3.2-1b", backend="plain_loop", dtype="bfloat16", device="cuda",
        per_device_train_batch_size=16, max_seq_length=2048, synthetic_min_words=4096, synthetic_max_words=4100,
    )  # fmt: skip
    shape, _ = shape_of(args)
    h200 = Target(name="H200", memory_bytes=143771 * 2**20, peak_tflops=None, assumed_mfu=None)
    assert predict_condition("c", args, h200, shape).verdict == "fits"
    capped = TrainingArgs(**{**args.__dict__, "gpu_memory_cap_gib": 40.0})
    assert predict_condition("c", capped, h200, shape).verdict == "oom"


def test_planning_refuses_more_gpus_than_the_machine_has_and_a_cap_above_its_gpu(monkeypatch):
    from finetune_bench.measuring import gpu
    from tasks import plan

    monkeypatch.setattr(gpu, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 2)
    monkeypatch.setattr(gpu, "gpu_memory_bytes", lambda: 81559 * 2**20)
    monkeypatch.setattr(plan, "for_a_cluster", lambda: False)
    args = TrainingArgs(device="cuda", num_gpus=4, parallelism="fsdp", gpu_memory_cap_gib=96.0)
    with pytest.raises(SpecError) as refused:
        plan.check_gpus_here([args])
    problems = refused.value.problems
    assert problems[0].startswith("training_args.num_gpus 4: this machine has 2 GPU(s) (NVIDIA H100 80GB HBM3)")
    assert problems[1].startswith("training_args.gpu_memory_cap_gib 96 is above the memory of NVIDIA H100 80GB HBM3")
    plan.check_gpus_here([TrainingArgs(device="cuda", num_gpus=2, parallelism="fsdp", gpu_memory_cap_gib=40.0)])
    monkeypatch.setattr(plan, "for_a_cluster", lambda: True)  # a cluster's pods ask for their own GPUs
    plan.check_gpus_here([args])


def test_what_a_machine_cannot_train_is_named_from_its_gpus_alone():
    """The core check, without Flyte: its problems from the GPUs it is handed."""
    from finetune_bench.inputs.machine import machine_problems

    conditions = [TrainingArgs(device="cuda"), TrainingArgs(arm="float8", gpu_memory_cap_gib=40.0)]
    none = machine_problems(conditions, [], None)
    assert none[0].startswith("training_args.device 'cuda': no NVIDIA GPU is visible on this machine")
    assert none[1].startswith("arm 'float8': float8 training needs a CUDA GPU")
    assert none[2].startswith("training_args.gpu_memory_cap_gib 40: no NVIDIA GPU is visible") and len(none) == 3
    assert machine_problems([TrainingArgs(device="cpu", arm="float8")], [], None) == []  # a CPU run asks for no GPU
    one = machine_problems([TrainingArgs(num_gpus=2, parallelism="ddp")] * 2, ["NVIDIA H200"], 140 * 2**30)
    assert one == [
        "training_args.num_gpus 2: this machine has 1 GPU(s) (NVIDIA H200), and a run on 2 would wait for GPUs that "
        "never come; set num_gpus to at most 1, or run it on a cluster (union run --remote)"
    ]  # each problem once
