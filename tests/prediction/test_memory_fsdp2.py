"""The memory model under FSDP2 (the plain loop's `fully_shard` per decoder layer): its allocated peaks, by moment,
against every Llama-3-8B condition measured so far, and how its terms behave."""

import dataclasses

import pytest

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction import memory
from finetune_bench.prediction.gpus import GIB
from finetune_bench.prediction.shapes import NoPrediction, model_config, model_shape

SHAPE = model_shape(model_config("random:llama-3-8b"))
# Random-init Llama-3-8B, full fine-tune, bf16, the plain loop, FSDP2, AdamW (adamw_torch), every sequence full.
BASE = TrainingArgs(
    model_name="random:llama-3-8b", backend="plain_loop", dtype="bfloat16", device="cuda", parallelism="fsdp",
    gradient_checkpointing=True, optim="adamw_torch",
)  # fmt: skip
TOLERANCE = 0.05
START, STEP = memory.BACKWARD_START, memory.OPTIMIZER_STEP


@dataclasses.dataclass(frozen=True)
class Measured:
    """One measured condition: its settings, and the largest rank's peak allocated GiB, of the run and of each phase
    the docs give (None where they do not)."""

    gpus: int
    batch: int
    length: int
    arm: str
    peak: float
    peak_at: str  # the moment whose phases set the measured peak
    forward: float | None = None  # the forward pass with the loss
    backward: float | None = None
    optimizer: float | None = None
    checkpointing: bool = True
    sequences_full: bool = True  # at 4,096 tokens the generated rows left 3.4-5.2 % padding
    source: str = "headline"  # which of the docs' sections (below)

    def args(self) -> TrainingArgs:
        return dataclasses.replace(
            BASE, num_gpus=self.gpus, per_device_train_batch_size=self.batch, max_seq_length=self.length,
            arm=self.arm, gradient_checkpointing=self.checkpointing,
        )  # fmt: skip

    def id(self) -> str:
        checkpointing = "" if self.checkpointing else "-no-checkpointing"
        return f"{self.source}-{self.gpus}gpu-{self.batch}x{self.length}-{self.arm}{checkpointing}"


MEASURED = [
    # docs/measurements.md, "Where the peak comes from: Llama-3-8B under FSDP on two GPUs" (two H200s; per phase)
    Measured(2, 4, 2048, "baseline", 38.86, START, forward=36.90, backward=38.86, optimizer=37.46, source="two-gpus"),
    Measured(2, 4, 2048, "liger", 37.46, STEP, forward=28.09, backward=34.27, optimizer=37.46, source="two-gpus"),
    # docs/multi-gpu.md, "Liger's headline setup on four GPUs: Llama-3-8B, FSDP2" (four H200s): allocated,
    # liger / baseline; "the optimizer step peaks at 18.76 GiB in every condition and both arms, and the backward
    # pass sets every peak"
    Measured(4, 4, 2048, "liger", 20.0, START, backward=20.0, optimizer=18.76),
    Measured(4, 4, 2048, "baseline", 27.6, START, backward=27.6, optimizer=18.76),
    Measured(4, 4, 4096, "liger", 22.5, START, backward=22.5, optimizer=18.76, sequences_full=False),
    Measured(4, 4, 4096, "baseline", 41.7, START, backward=41.7, optimizer=18.76, sequences_full=False),
    Measured(4, 8, 2048, "liger", 22.1, START, backward=22.1, optimizer=18.76),
    Measured(4, 8, 2048, "baseline", 41.6, START, backward=41.6, optimizer=18.76),
    Measured(4, 8, 4096, "liger", 29.3, START, backward=29.3, optimizer=18.76, sequences_full=False),
    Measured(4, 8, 4096, "baseline", 69.7, START, backward=69.7, optimizer=18.76, sequences_full=False),
    # the same section, "Without gradient checkpointing", 4 × 2,048: peaks at the backward pass
    Measured(4, 4, 2048, "liger", 49.45, START, backward=49.45, checkpointing=False),
    Measured(4, 4, 2048, "baseline", 74.67, START, backward=74.67, checkpointing=False),
    # docs/multi-gpu.md, "Measured: the stacks at Llama-3-8B under FSDP2 on four GPUs" (batch 4 × 2,048): "allocated
    # peak (phase)", and "the optimizer step is 18.76 GiB in every arm" (float8+compile and compile: not predicted)
    Measured(4, 4, 2048, "baseline", 27.64, START, backward=27.64, optimizer=18.76, source="stacks"),
    Measured(4, 4, 2048, "liger", 20.00, START, backward=20.00, optimizer=18.76, source="stacks"),
    Measured(4, 4, 2048, "cce", 20.75, START, backward=20.75, optimizer=18.76, source="stacks"),
    Measured(4, 4, 2048, "liger-without-loss+cce", 20.00, START, backward=20.00, optimizer=18.76, source="stacks"),
]


@pytest.mark.parametrize("measured", MEASURED, ids=Measured.id)
def test_the_allocated_peak_and_each_moment_match_the_measured_phases(measured):
    prediction = memory.predict_memory(measured.args(), SHAPE, sequences_full=measured.sequences_full)
    assert prediction.peak_allocated_bytes / GIB == pytest.approx(measured.peak, rel=TOLERANCE)
    assert prediction.phase == measured.peak_at
    # the backward pass's moment against the largest of the forward (with the loss) and backward phases
    # (`memory.MOMENT_PHASES`), the optimizer step against its own
    phases = [value for value in (measured.forward, measured.backward) if value is not None]
    assert prediction.moments[START] / GIB == pytest.approx(max(phases), rel=TOLERANCE)
    if measured.optimizer is not None:
        assert prediction.moments[STEP] / GIB == pytest.approx(measured.optimizer, rel=TOLERANCE)
    assert sum(prediction.breakdown.values()) == pytest.approx(prediction.peak_reserved_bytes)


def _predict(**changes) -> memory.MemoryPrediction:
    """Four GPUs, batch 4 × 2,048 per GPU unless `changes` say otherwise."""
    settings = {"num_gpus": 4, "per_device_train_batch_size": 4, "max_seq_length": 2048, **changes}
    return memory.predict_memory(dataclasses.replace(BASE, **settings), SHAPE)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_shards_are_one_world_size_th_of_one_gpu_s(gpus):
    """Weights, gradients, AdamW's two states and its step's temporary (bf16 each): 10 bytes a parameter over the
    ranks at the optimizer step; the weights and states are the same shards at either moment."""
    prediction = _predict(num_gpus=gpus, per_device_train_batch_size=1, max_seq_length=512)
    parameters = SHAPE.parameters
    assert prediction.moments[STEP] == pytest.approx(10 * parameters / gpus)
    assert prediction.breakdown["weights"] == pytest.approx(2 * parameters / gpus)
    assert prediction.breakdown["optimizer_states"] == pytest.approx(4 * parameters / gpus)
    assert any(a.startswith(f"FSDP2 on {gpus} GPUs") for a in prediction.assumptions)
    one = memory.predict_memory(dataclasses.replace(BASE, per_device_train_batch_size=1, max_seq_length=512), SHAPE)
    assert prediction.moments[STEP] == pytest.approx(one.moments[STEP] / gpus)


def test_what_each_rank_gathers_does_not_shrink_with_more_ranks():
    """The root module (embedding, final norm, LM head) stays gathered whole through the backward pass, and whole
    decoder layers are gathered: on 8 GPUs only the shards halve against 4."""
    four, eight = _predict(num_gpus=4), _predict(num_gpus=8)
    root = 2 * (SHAPE.parameters - SHAPE.num_layers * SHAPE.layer_parameters)
    assert four.breakdown["fsdp_unsharded"] >= root and eight.breakdown["fsdp_unsharded"] >= root
    sharded = 6 * SHAPE.parameters  # weights and AdamW's states, bf16
    assert four.moments[START] - eight.moments[START] >= sharded / 4 - sharded / 8 - 1


def test_liger_s_loss_changes_the_backward_pass_s_moment_only():
    model_loss, fused = _predict(), _predict(criterion="liger_fused_linear_cross_entropy")
    assert fused.loss_path == "liger_fused_linear_cross_entropy" and model_loss.loss_path == "hf_cross_entropy"
    assert fused.moments[STEP] == model_loss.moments[STEP]
    assert fused.moments[START] < model_loss.moments[START] - 5 * GIB  # the float32 logits, 12 bytes an entry
    # transformers' loss peaks at the loss; the fused one leaves the peak to a decoder layer's backward
    assert model_loss.breakdown["logits_and_loss"] > 10 * GIB and fused.breakdown["logits_and_loss"] == 0


def test_without_checkpointing_every_layer_s_activations_are_kept():
    checkpointed, kept = _predict(arm="liger"), _predict(arm="liger", gradient_checkpointing=False)
    assert kept.breakdown["activations"] > 10 * checkpointed.breakdown["activations"]
    assert kept.moments[START] > checkpointed.moments[START] + 20 * GIB
    assert kept.moments[STEP] == checkpointed.moments[STEP]


def test_the_largest_point_of_the_backward_pass_is_named():
    assert any(a.endswith("peaks at its start (the loss's backward)") for a in _predict().assumptions)
    liger = _predict(arm="liger", per_device_train_batch_size=1, max_seq_length=512)
    assert any(a.endswith("peaks at its end (the root module's reduce-scatter)") for a in liger.assumptions)


def test_fsdp2_through_the_trainers_or_with_accumulation_is_not_predicted_and_says_why():
    """TRL's SFTTrainer under FSDP2 (docs/multi-gpu.md, the headline section: 4 × 2,048 on four H100s, liger's
    backward 17.92 GiB against the plain loop's 20.0) shards through accelerate, which the model does not count."""
    with pytest.raises(NoPrediction, match="FSDP2 through backend 'trl_sft': accelerate's fully_shard"):
        memory.predict_memory(dataclasses.replace(BASE, num_gpus=4, backend="trl_sft"), SHAPE)
    with pytest.raises(NoPrediction, match="FSDP2 and gradient accumulation: the unsharded gradients"):
        _predict(gradient_accumulation_steps=2)
