"""Held-out evaluation: the split, the loss it computes, where it is recorded, and that it stays out of the steps.

Runs go through the real child-process launcher on the random-init tiny Llama (CPU, fp32).
"""

import dataclasses
import math

import pandas as pd
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.measuring import steps as steps_module
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.backends.data import collate, tokenize_prompt_completion
from finetune_bench.running.backends.evaluation import HeldOutEvaluator, held_out_loss
from finetune_bench.running.launch import run_in_child
from finetune_bench.running.preflight import refuse_unfillable
from finetune_bench.sources.datasets import load_prompt_completion, split_held_out

pytestmark = pytest.mark.usefixtures("undo_liger_patches")

EVAL_EXAMPLES = 6


def test_split_held_out_is_fixed_disjoint_and_keeps_the_training_order(tiny_dataset_dir):
    dataset = load_prompt_completion(tiny_dataset_dir)
    training, held_out = split_held_out(dataset, EVAL_EXAMPLES)
    again = split_held_out(dataset, EVAL_EXAMPLES)[1]
    assert len(held_out) == EVAL_EXAMPLES and len(training) == len(dataset) - EVAL_EXAMPLES
    assert list(held_out["completion"]) == list(again["completion"])
    assert not set(held_out["completion"]) & set(training["completion"])
    positions = {text: i for i, text in enumerate(dataset["completion"])}
    order = [positions[text] for text in training["completion"]]
    assert order == sorted(order)
    assert split_held_out(dataset, 0) == (dataset, None)
    with pytest.raises(ValueError, match="would hold out every example"):
        split_held_out(dataset, len(dataset))


def test_held_out_loss_is_the_token_weighted_mean_of_the_models_own_loss(tiny_dataset_dir, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir), dtype=torch.float32)
    encoded = tokenize_prompt_completion(load_prompt_completion(tiny_dataset_dir).select(range(5)), tokenizer, 96)
    assert len(encoded) == 5 and len({len(row["input_ids"]) for row in encoded}) > 1  # padded batches below
    # Batches of 2 with padding against each example alone through the model's own loss.
    batches = [collate([encoded[i] for i in range(j, min(j + 2, 5))], tokenizer.pad_token_id) for j in (0, 2, 4)]
    model.train()
    loss, tokens = held_out_loss(model, batches, torch.device("cpu"))
    assert model.training  # left as it was
    total, expected_tokens = 0.0, 0
    with torch.no_grad():
        for row in encoded:
            ids, labels = torch.tensor([row["input_ids"]]), torch.tensor([row["labels"]])
            scored = int((labels[0, 1:] != -100).sum())
            total += float(model.eval()(input_ids=ids, labels=labels).loss) * scored
            expected_tokens += scored
    assert tokens == expected_tokens
    assert loss == pytest.approx(total / expected_tokens, rel=1e-5)


def test_evaluation_is_kept_out_of_the_step_times(monkeypatch):
    clock = iter(float(t) for t in range(1000))
    now = {"t": 0.0}

    def fake_clock() -> float:
        now["t"] = next(clock)
        return now["t"]

    monkeypatch.setattr(steps_module.time, "perf_counter", fake_clock)
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    recorder.end_step()
    with recorder.outside_steps():
        for _ in range(50):  # an evaluation that takes 50 ticks
            fake_clock()
    recorder.record_eval(1, 2.5, tokens=10, seconds=50.0)
    recorder.end_step()
    times = [s.step_time_s for s in recorder.steps]
    assert times == [1.0, 1.0]
    assert recorder.steps[0].eval_loss == 2.5 and recorder.steps[1].eval_loss is None
    summary = recorder.summary()
    assert summary["final_eval_loss"] == 2.5 and summary["final_eval_perplexity"] == pytest.approx(math.exp(2.5))
    assert summary["eval_time_s"] == 50.0 and summary["eval_tokens"] == 10.0


def test_a_nonfinite_held_out_loss_ends_the_run():
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    with pytest.raises(steps_module.NonFiniteLoss, match="held-out loss is nan after step 0"):
        recorder.record_eval(0, float("nan"), tokens=1, seconds=0.0)


def test_evaluations_fall_before_training_every_eval_steps_and_after_the_last(tiny_dataset_dir, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    held_out = split_held_out(load_prompt_completion(tiny_dataset_dir), 2)[1]
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    args = dataclasses.replace(TrainingArgs(), eval_examples=2, eval_steps=3, max_steps=7, max_seq_length=96)
    evaluator = HeldOutEvaluator(args, held_out, tokenizer, torch.device("cpu"), recorder)
    assert [step for step in range(8) if evaluator.due(step)] == [0, 3, 6, 7]
    none = HeldOutEvaluator(dataclasses.replace(args, eval_examples=0), None, tokenizer, torch.device("cpu"), recorder)
    assert not any(none.due(step) for step in range(8))


def _run(tmp_path, dataset_dir, model_dir, name: str, **overrides):
    settings = dict(eval_examples=EVAL_EXAMPLES, eval_steps=2, max_steps=3, per_device_eval_batch_size=4)
    args = dataclasses.replace(TrainingArgs(), **{**settings, "max_seq_length": 64, **overrides})
    planned = PlannedRun(condition_id=name, run_number=0, training_args=args, swept_axes=[])
    result = run_in_child(planned, dataset_dir, model_dir, tmp_path / name, timeout_s=300)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    return result


@pytest.fixture(scope="module")
def evaluated_runs(tmp_path_factory, tiny_dataset_dir, tiny_model_dir):
    """The baseline through every training backend, and the liger arm through the plain loop, with a held-out set.
    The liger arm (its kernels in the Triton interpreter, the slowest run here) trains one step: the plain loop's
    schedule over three steps is the baseline's, and its held-out loss before the first step is what it is checked
    on."""
    tmp_path = tmp_path_factory.mktemp("eval")
    runs = {
        backend: _run(tmp_path, tiny_dataset_dir, tiny_model_dir, backend, backend=backend)
        for backend in ("plain_loop", "hf_trainer", "trl_sft")
    }
    runs["liger"] = _run(
        tmp_path, tiny_dataset_dir, tiny_model_dir, "liger", backend="plain_loop", arm="liger", max_steps=1
    )
    return runs


def test_every_backend_records_the_held_out_loss_after_the_steps_it_is_due(evaluated_runs):
    for name, result in evaluated_runs.items():
        steps = pd.read_csv(result.steps_file)
        # eval_steps=2: after step 2 and the last (3); the one-step liger run: after its last, step 1
        due = [True] if name == "liger" else [False, True, True]
        assert steps["eval_loss"].notna().tolist() == due, name
        metrics = result.metrics
        assert metrics["final_eval_loss"] == pytest.approx(steps["eval_loss"].iloc[-1])
        assert metrics["final_eval_perplexity"] == pytest.approx(math.exp(metrics["final_eval_loss"]))
        assert metrics["eval_tokens"] > 0 and metrics["eval_time_s"] > 0
        # steps at learning rate 2e-5 move a random-init model a little: the held-out loss changes
        assert metrics["final_eval_loss"] != metrics["initial_eval_loss"], name


def test_the_held_out_loss_is_the_same_computation_in_every_backend_and_arm(evaluated_runs):
    """Before the first step every run holds the same seeded model: its held-out loss must agree exactly across
    backends (one computation, one held-out set), and to float32 noise with Liger's kernels (interpreted)."""
    initial = {name: result.metrics["initial_eval_loss"] for name, result in evaluated_runs.items()}
    assert initial["hf_trainer"] == initial["plain_loop"] == initial["trl_sft"]
    assert initial["liger"] == pytest.approx(initial["plain_loop"], rel=1e-5)
    # about ln(vocabulary): a random-init model knows nothing yet
    assert initial["plain_loop"] == pytest.approx(math.log(1024), rel=0.1)


def test_eval_settings_are_checked_before_anything_runs():
    base = {"dataset_name": "synthetic:alpaca", "synthetic_num_examples": 8}
    with pytest.raises(SpecError) as caught:
        plan_runs(
            ExperimentArgs(backend=["forward_only", "plain_loop"], per_device_train_batch_size=[4]),
            TrainingArgs(**base, eval_examples=6),
            1,
        )
    message = str(caught.value)
    assert "eval_examples (6) with backend 'forward_only'" in message
    assert "below one batch of per_device_train_batch_size 4 once eval_examples (6) are held out" in message
    with pytest.raises(SpecError, match="holds out every one of the synthetic_num_examples"):
        plan_runs(ExperimentArgs(), TrainingArgs(**base, eval_examples=8), 1)
    with pytest.raises(SpecError, match="eval_steps must not be negative"):
        TrainingArgs(eval_steps=-1).check()
    with pytest.raises(SpecError, match="per_device_eval_batch_size must be positive"):
        TrainingArgs(per_device_eval_batch_size=0).check()


def test_preflight_counts_only_the_examples_left_to_train_on(tiny_dataset_dir, tiny_model_dir):
    total = len(load_prompt_completion(tiny_dataset_dir))
    args = dataclasses.replace(
        TrainingArgs(), backend="plain_loop", per_device_train_batch_size=total - 4, max_seq_length=4096
    )
    runs = [
        PlannedRun(
            condition_id=f"c{n}", run_number=0, training_args=dataclasses.replace(args, eval_examples=n), swept_axes=[]
        )
        for n in (0, 8, total)
    ]
    checked = refuse_unfillable(runs, tiny_dataset_dir, tiny_model_dir)
    assert not checked[0].refused
    assert f"the dataset has {total - 8} usable examples, fewer than one batch of {total - 4}" in checked[1].refused
    assert "would hold out every example" in checked[2].refused


def test_an_evaluation_out_of_memory_ends_the_evaluations_not_the_run(tiny_dataset_dir, tiny_model_dir, monkeypatch):
    from finetune_bench.running.backends import evaluation

    def out_of_memory(*_args, **_kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    monkeypatch.setattr(evaluation, "held_out_loss", out_of_memory)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    held_out = split_held_out(load_prompt_completion(tiny_dataset_dir), 2)[1]
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    args = dataclasses.replace(TrainingArgs(), eval_examples=2, eval_steps=1, max_steps=3, max_seq_length=96)
    evaluator = HeldOutEvaluator(args, held_out, tokenizer, torch.device("cpu"), recorder)
    recorder.begin_training()
    recorder.end_step()
    evaluator.maybe_evaluate(torch.nn.Linear(1, 1), 1)
    assert recorder.eval_error.startswith("out of memory in the held-out evaluation after step 1, none after it")
    assert "Tried to allocate 2.00 GiB" in recorder.eval_error
    assert not any(evaluator.due(step) for step in range(4))  # no evaluation after it
    recorder.end_step()  # training goes on, measured
    assert len(recorder.steps) == 2 and "final_eval_loss" not in recorder.summary()
