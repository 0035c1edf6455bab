"""float16 mixed precision (`dtype: float16` with a backend that trains), on a CPU: float32 master weights, CPU
float16 autocast, a dynamic loss scale (torch.amp.GradScaler("cpu")), in the plain loop (`LossScaling`) and through
the Trainers' own `fp16` (accelerate's autocast and scaler, which the backends switch on for a CPU).

The runs go through the real child-process launcher on the random-init tiny Llama; the loss scaler's skipping of a
step is checked in this process, where an inf gradient can be planted."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.backends.common import trains_mixed_float16, weight_dtype
from finetune_bench.running.backends.mixed_precision import LossScaling, check_float16_parallelism
from finetune_bench.running.launch import run_in_child

INITIAL_SCALE = 2.0**16  # torch.amp.GradScaler's (and accelerate's) initial loss scale
STEPS = 8


def training_args(**overrides) -> TrainingArgs:
    return dataclasses.replace(
        TrainingArgs(),
        **{"dtype": "float16", "device": "cpu", "max_steps": STEPS, "learning_rate": 1e-3, "eval_examples": 4,
           **overrides},
    )  # fmt: skip


def run(tmp_path, tiny_dataset_dir, tiny_model_dir, name: str, **overrides):
    planned = PlannedRun(condition_id=name, run_number=0, training_args=training_args(**overrides), swept_axes=[])
    result = run_in_child(planned, tiny_dataset_dir, tiny_model_dir, tmp_path / name, timeout_s=300)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    return result


def assert_trained_in_mixed_precision(result, trainable: str = "float32", frozen: str = "") -> None:
    details = result.details
    assert details["dtype"] == "float16"  # what the run computed in, as the report shows it
    assert details["trainable_dtype"] == trainable and details["frozen_dtype"] == frozen
    skipped = int(details["loss_scale_skipped_steps"])
    assert 0 <= skipped < STEPS
    # the scale halves at every skipped step and grows only after 2,000 clean ones
    assert float(details["loss_scale"]) == INITIAL_SCALE / 2**skipped
    losses = pd.read_csv(result.steps_file)["loss"]
    assert len(losses) == STEPS and losses.map(math.isfinite).all()
    # trained: the held-out loss went down
    assert result.metrics["final_eval_loss"] < result.metrics["initial_eval_loss"]


def test_the_plain_loop_trains_float16_with_float32_master_weights(tmp_path, tiny_dataset_dir, tiny_model_dir):
    result = run(
        tmp_path, tiny_dataset_dir, tiny_model_dir, "plain", backend="plain_loop", gradient_accumulation_steps=2
    )
    assert_trained_in_mixed_precision(result)


@pytest.mark.parametrize("backend", ["hf_trainer", "trl_sft"])
def test_the_trainers_train_float16_with_float32_master_weights(backend, tmp_path, tiny_dataset_dir, tiny_model_dir):
    assert_trained_in_mixed_precision(run(tmp_path, tiny_dataset_dir, tiny_model_dir, backend, backend=backend))


def test_float16_lora_trains_float32_adapters_on_a_float16_base(tmp_path, tiny_dataset_dir, tiny_model_dir):
    result = run(tmp_path, tiny_dataset_dir, tiny_model_dir, "lora", backend="hf_trainer", lora_rank=4)
    assert_trained_in_mixed_precision(result, trainable="float32", frozen="float16")
    assert result.details["lora_adapters_trained"] == "14/14"


def test_float16_weights_are_float32_only_where_they_train():
    float16 = torch.float16
    for backend in ("plain_loop", "hf_trainer", "trl_sft"):
        args = training_args(backend=backend)
        assert trains_mixed_float16(args, float16) and weight_dtype(args, float16) == torch.float32
    lora = training_args(backend="hf_trainer", lora_rank=4)
    assert weight_dtype(lora, float16) == float16  # the frozen base; peft keeps the adapters float32
    forward_only = training_args(backend="forward_only", eval_examples=0)
    assert not trains_mixed_float16(forward_only, float16) and weight_dtype(forward_only, float16) == float16
    for dtype in (torch.bfloat16, torch.float32):  # trained as they are
        assert not trains_mixed_float16(training_args(backend="plain_loop"), dtype)
        assert weight_dtype(training_args(backend="plain_loop"), dtype) == dtype


def test_float16_is_not_sharded_at_run_time_either():
    fsdp = training_args(backend="plain_loop", num_gpus=2, parallelism="fsdp")
    with pytest.raises(ValueError, match="dtype 'float16' with parallelism 'fsdp'"):
        check_float16_parallelism(fsdp, mixed_float16=True)
    check_float16_parallelism(training_args(backend="plain_loop", num_gpus=2, parallelism="ddp"), True)
    check_float16_parallelism(fsdp, mixed_float16=False)  # bfloat16 and float32 are sharded as they are


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def backward(scaling: LossScaling, model: torch.nn.Module, x: torch.Tensor) -> None:
    with scaling.autocast():
        out = model(x)
        assert out.dtype == torch.float16  # float16 matmuls from float32 weights
        loss = out.float().pow(2).mean()
    scaling.backward(loss)


def test_loss_scaling_steps_on_unscaled_gradients_and_skips_a_step_with_an_inf_gradient():
    model, x = small_model(), torch.randn(32, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaling = LossScaling(torch.device("cpu"), True, optimizer)

    # a clean step: the update is the unscaled gradient (SGD: lr × gradient), not the scaled one
    backward(scaling, model, x)
    grads = [p.grad.clone() / INITIAL_SCALE for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    assert scaling.step(optimizer, model.parameters(), max_norm=0)
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        assert p.dtype == torch.float32
        torch.testing.assert_close(b - p.detach(), 0.5 * g)
    assert scaling.scaler.get_scale() == INITIAL_SCALE and scaling.skipped_steps == 0

    # an inf in one gradient: the step is skipped (no weight moves) and the scale halves
    optimizer.zero_grad(set_to_none=True)
    backward(scaling, model, x)
    next(model.parameters()).grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    assert not scaling.step(optimizer, model.parameters(), max_norm=1.0)
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before, strict=True))
    assert scaling.scaler.get_scale() == INITIAL_SCALE / 2 and scaling.skipped_steps == 1

    # and the next clean step is taken again, clipped on the unscaled gradients
    optimizer.zero_grad(set_to_none=True)
    backward(scaling, model, x)
    before = [p.detach().clone() for p in model.parameters()]
    assert scaling.step(optimizer, model.parameters(), max_norm=1e-3)
    update = torch.cat([(b - p.detach()).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert float(update.norm()) == pytest.approx(0.5 * 1e-3, rel=1e-3)  # lr × the clipped norm
    details = scaling.details(model)
    assert details == {
        "loss_scale": INITIAL_SCALE / 2,
        "loss_scale_skipped_steps": 1,
        "trainable_dtype": "float32",
        "frozen_dtype": "",
    }


def test_loss_scaling_off_steps_plainly_and_records_nothing():
    model, x = small_model(), torch.randn(32, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaling = LossScaling(torch.device("cpu"), False, optimizer)
    with scaling.autocast():
        loss = model(x).pow(2).mean()
    assert loss.dtype == torch.float32  # no autocast
    scaling.backward(loss)
    grads = [p.grad.clone() for p in model.parameters()]  # not scaled
    before = [p.detach().clone() for p in model.parameters()]
    assert scaling.step(optimizer, model.parameters(), max_norm=0)
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        torch.testing.assert_close(b - p.detach(), 0.5 * g)
    assert scaling.details(model) == {}


def test_the_trainer_skips_a_step_with_an_inf_gradient_and_shrinks_its_scale(tmp_path, tiny_model_dir):
    """The Trainer's own fp16 path on a CPU (accelerate's autocast and scaler, switched on by `recording_trainer`),
    an inf planted in one gradient of step 3: that step moves no weight, the scale halves, the callback counts it."""
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from finetune_bench.measuring.steps import StepRecorder
    from finetune_bench.running.backends.evaluation import HeldOutEvaluator
    from finetune_bench.running.backends.trainer_common import (
        check_loss_scaling,
        mixed_precision_details,
        recording_callback,
        recording_trainer,
        training_arguments,
    )

    cpu = torch.device("cpu")
    args = training_args(backend="hf_trainer", max_steps=5, eval_examples=0, max_grad_norm=1.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir), dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (16, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]

    backward_passes = 0
    weight = model.model.layers[0].mlp.down_proj.weight

    def plant_inf(grad: torch.Tensor) -> torch.Tensor:
        nonlocal backward_passes
        backward_passes += 1
        return torch.full_like(grad, float("inf")) if backward_passes == 3 else grad

    weight.register_hook(plant_inf)
    snapshots = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, *_, **__):
            snapshots.append(weight.detach().clone())

    recorder = StepRecorder(device=cpu, warmup_steps=0)
    callback = recording_callback(recorder, HeldOutEvaluator(args, None, None, cpu, recorder))
    hf_args = TrainingArguments(**training_arguments(args, cpu, torch.float16, tmp_path))
    assert hf_args.fp16
    trainer = recording_trainer(Trainer, recorder)(
        model=model, args=hf_args, train_dataset=data, callbacks=[callback, Snapshot()]
    )
    check_loss_scaling(trainer)  # accelerate's autocast and scaler are on, on a CPU
    trainer.train()

    details = mixed_precision_details(trainer, callback)
    skipped = details["loss_scale_skipped_steps"]
    assert skipped >= 1 and details["loss_scale"] == INITIAL_SCALE / 2**skipped
    assert torch.equal(snapshots[2], snapshots[1]), "step 3's inf gradient moved the weight"
    assert not torch.equal(snapshots[4], snapshots[2]), "no step after it trained"
    assert details["trainable_dtype"] == "float32" and weight.dtype == torch.float32
    assert recorder.steps and all(math.isfinite(s.loss) for s in recorder.steps)


# slow: every criterion, Liger's in the Triton interpreter (the plain loop's float16 training is in make test above)
@pytest.mark.slow
def test_every_plain_loop_loss_gives_float32_gradients_under_float16_autocast(tiny_model_dir):
    """Each criterion the plain loop computes, under float16 autocast with float32 weights and the initial loss
    scale, against torch's cross entropy in float32 (in a process of its own: Liger's kernels run in the Triton
    interpreter there)."""
    script = Path(__file__).parent / "scripts" / "float16_loss_check.py"
    completed = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = json.loads(completed.stdout.strip().splitlines()[-1])
    reference = out["reference_loss"]
    for criterion in (
        "model",
        "torch_cross_entropy",
        "liger_cross_entropy",
        "liger_fused_linear_cross_entropy",
        "cce",
        "model_liger_fused",
    ):
        checked = out[criterion]
        assert checked["dtype"] == "float32", criterion  # a float16 loss would overflow at the scale of 65,536
        assert checked["finite"] and checked["gradient_dtypes"] == ["float32"], criterion
        assert checked["loss"] == pytest.approx(reference, rel=1e-3), criterion
        # float16 matmuls: errors of a few 1e-4 (torch's cross entropy on float16 logits has the same)
        assert max(checked["relative_error"].values()) < 5e-3, (criterion, checked["relative_error"])
    assert out["model_liger_fused"]["loss_path"] == "liger_fused_linear_cross_entropy"
    # why Liger's cross entropy takes float32 logits under float16 mixed precision: on float16 logits its loss is
    # float16 and the loss scale overflows the gradient it wrote into them
    float16_logits = out["liger_cross_entropy_on_float16_logits"]
    assert float16_logits["dtype"] == "float16" and not float16_logits["finite"]


@pytest.mark.parametrize("backend", ["plain_loop", pytest.param("hf_trainer", marks=pytest.mark.slow)])
def test_two_ranks_train_float16_over_ddp(backend, tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch):
    """Through the real Elastic task, two ranks over gloo (tests/running/test_ranks.py): DDP all-reduces the scaled
    gradients before they are unscaled, so both ranks see the same inf/NaN and skip the same steps."""
    from tests.running.test_ranks import _launch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as test_ranks.py sets it for its launches
    result = _launch(tmp_path, tiny_dataset_dir, tiny_model_dir, backend=backend, dtype="float16", max_steps=4)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    assert [(r.rank, r.status) for r in result.ranks] == [(0, "ok"), (1, "ok")]
    assert result.details["dtype"] == "float16" and result.details["trainable_dtype"] == "float32"
    skipped = int(result.details["loss_scale_skipped_steps"])
    assert float(result.details["loss_scale"]) == INITIAL_SCALE / 2**skipped
