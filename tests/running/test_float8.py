"""The float8 component's wiring on a CPU: which layers torchao converts (the decoder's linear layers, never the LM
head), and the refusals a machine without float8 matmuls gives before anything is loaded. Its matmuls are a GPU's:
the float8 figures are measured on one (docs/measurements.md)."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from finetune_bench.running.float8 import Float8NotRunnable, apply_float8, check_float8_runs_here, float8_eligible


def tiny_llama(hidden: int = 32) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2, vocab_size=96
    )
    return LlamaForCausalLM(config)


def test_float8_converts_every_decoder_linear_layer_and_leaves_the_lm_head():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_llama()
    linear_layers = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    converted = apply_float8(model)
    assert converted == len(linear_layers) - 1 == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert type(model.lm_head) is torch.nn.Linear
    assert all(
        isinstance(layer, Float8Linear)
        for layer in model.model.layers[0].self_attn.children()
        if isinstance(layer, torch.nn.Linear)
    )


def test_layers_float8_s_matmul_does_not_take_stay_as_they_are():
    assert not float8_eligible(torch.nn.Linear(24, 32), None)  # 24 is not a multiple of 16
    head = torch.nn.Linear(32, 96)
    assert float8_eligible(head, None) and not float8_eligible(head, head)
    with pytest.raises(Float8NotRunnable, match="converted no linear layer"):
        apply_float8(tiny_llama(hidden=24))


def test_a_cpu_run_of_float8_is_refused_before_loading():
    with pytest.raises(Float8NotRunnable, match="needs a CUDA GPU, and this run's device is cpu"):
        check_float8_runs_here(torch.device("cpu"))


@pytest.mark.parametrize(("capability", "refused"), [((8, 0), True), ((8, 6), True), ((8, 9), False), ((9, 0), False)])
def test_a_gpu_below_compute_capability_8_9_is_refused_naming_its_capability(monkeypatch, capability, refused):
    # no such GPU here: the capability torch reports is a stand-in (an A100 is 8.0, an A10 8.6, an L4 8.9, H100 9.0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Stand-in")
    if not refused:
        check_float8_runs_here(torch.device("cuda"))
        return
    needed = rf"compute capability 8\.9 or newer .*NVIDIA Stand-in has {capability[0]}\.{capability[1]}"
    with pytest.raises(Float8NotRunnable, match=needed):
        check_float8_runs_here(torch.device("cuda"))


@pytest.mark.parametrize("all_gather", [False, True])
def test_for_fsdp2_on_gpus_the_float8_layers_all_gather_their_weights_in_float8(all_gather):
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model = tiny_llama()
    apply_float8(model, fsdp_float8_all_gather=all_gather)
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert layers and all(m.config.enable_fsdp_float8_all_gather is all_gather for m in layers)
    # the weight FSDP2 shards: a tensor subclass whose all-gather casts the shard to float8 first
    assert all(isinstance(m.weight, WeightWithDynamicFloat8CastTensor) is all_gather for m in layers)
    assert not isinstance(model.lm_head.weight, WeightWithDynamicFloat8CastTensor)


def _train_a_float8_rank(rank: int, port: int, parallelism: str, dataset_dir, model_dir, work_dir) -> None:
    """One of two gloo ranks training the float8 arm through the plain loop's own `train` (float8's matmuls run on
    this CPU here, which a run refuses: the check is lifted in this process only); its details, losses and the
    float8 scales' precomputations to `work_dir`/rank<rank>.json."""
    import dataclasses
    import json
    import os

    import finetune_bench.running.backends.common as common
    import finetune_bench.running.backends.plain_loop as plain_loop
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.measuring.steps import StepRecorder
    from finetune_bench.running.distributed import end_process_group, start_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["WORLD_SIZE"] = "2"
    common.check_float8_runs_here = lambda device: None
    precomputed = []  # the module whose scales each call precomputed: every converted weight's, from its shard

    def precompute(module: torch.nn.Module) -> None:
        plain_loop_precompute(module)
        precomputed.append(
            sum(getattr(p._local_tensor, "_precomputed_scale", None) is not None for p in module.parameters())
        )

    plain_loop_precompute, plain_loop.precompute_float8_scales = plain_loop.precompute_float8_scales, precompute
    torch.set_num_threads(1)
    args = dataclasses.replace(
        TrainingArgs(),
        **{"backend": "plain_loop", "arm": "float8", "device": "cpu", "dtype": "float32", "num_gpus": 2,
           "parallelism": parallelism, "max_steps": 3, "timing_warmup_steps": 1, "eval_examples": 0,
           "learning_rate": 1e-3, "per_device_train_batch_size": 2, "max_seq_length": 32},
    )  # fmt: skip
    start_process_group(torch.device("cpu"), 120)
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=1)
    try:
        details = plain_loop.train(args, dataset_dir, model_dir, torch.device("cpu"), torch.float32, recorder, work_dir)
    finally:
        end_process_group()
    losses = [step.loss for step in recorder.steps]
    out = {"details": details, "losses": losses, "precomputed": precomputed}
    (work_dir / f"rank{rank}.json").write_text(json.dumps(out, default=str))


# slow under DDP (FSDP2, which shards the float8 weights, is in make test)
@pytest.mark.parametrize("parallelism", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])
def test_two_ranks_train_the_float8_layers_under_ddp_and_fsdp2(parallelism, tmp_path, tiny_dataset_dir, tiny_model_dir):
    """The float8 arm on two gloo ranks through the plain loop: torchao's layers inside DDP's buckets, and under
    FSDP2 sharded with its float8 all-gather (the weights cast to float8 from each rank's shard; gloo moves them as
    bytes), every converted weight's scale precomputed after each optimizer step."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _train_a_float8_rank,
        args=(port, parallelism, tiny_dataset_dir, tiny_model_dir, tmp_path),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["details"]["float8_layers"] == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
        assert rank["details"]["float8_all_gather"] is (parallelism == "fsdp")
        assert len(rank["losses"]) == 3 and all(math.isfinite(loss) for loss in rank["losses"])
        # after each of the 3 steps, under FSDP2: the scales of all 14 converted weights; none under DDP
        assert rank["precomputed"] == ([2 * 7] * 3 if parallelism == "fsdp" else [])
    if parallelism == "ddp":  # each rank's loss of its own batch: different data, one model
        assert ranks[0]["losses"] != ranks[1]["losses"]


def _precompute_on_a_rank(rank: int, port: int, work_dir) -> None:
    import datetime
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from finetune_bench.running.float8 import precompute_float8_scales

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        torch.manual_seed(0)
        model = tiny_llama()
        full = {
            name: m.weight.detach().abs().max().item() for name, m in model.named_modules() if name.endswith("proj")
        }
        apply_float8(model, fsdp_float8_all_gather=True)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        precompute_float8_scales(model)
        scales = {
            name: m.weight._local_tensor._precomputed_scale.item()
            for name, m in model.named_modules()
            if name.endswith("proj")
        }
    finally:
        dist.destroy_process_group()
    (work_dir / f"rank{rank}.json").write_text(json.dumps({"amax": full, "scales": scales}))


def test_each_rank_s_precomputed_float8_scale_is_its_whole_weight_s(tmp_path):
    """`precompute_float8_scales` (the plain loop calls it after each optimizer step under FSDP2's float8
    all-gather): each rank holds a shard, and every rank's scale is that of the whole weight (float8 e4m3's largest
    value, 448, over the weight's largest magnitude), from one all-reduce."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_precompute_on_a_rank, args=(port, tmp_path), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["scales"] == ranks[1]["scales"] and len(ranks[0]["scales"]) == 2 * 7
    for name, scale in ranks[0]["scales"].items():
        assert scale == pytest.approx(torch.finfo(torch.float8_e4m3fn).max / ranks[0]["amax"][name], rel=1e-6), name
