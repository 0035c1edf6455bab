"""The `cce` criterion and arm on a CPU: Cut Cross-Entropy's loss equals torch's cross entropy on the same shifted,
masked labels, and a plain-loop run records what computed its loss.

On a CPU the criterion runs CCE's `torch_compile` implementation: its Triton kernels do not run under the Triton
interpreter (a libdevice stub in its log-sum-exp, NaN losses in bfloat16). The Triton kernels are a GPU run's.
"""

import dataclasses

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from finetune_bench.inputs.loss_paths import select_loss_path
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.backends.data import IGNORE_INDEX
from finetune_bench.running.backends.plain_loop import cce_implementation, loss_details, loss_function
from finetune_bench.running.launch import run_in_child


def tiny_batch() -> tuple[LlamaForCausalLM, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=96
    )
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(0, 96, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0  # a padded row
    labels = input_ids.clone()
    labels[:, :4] = IGNORE_INDEX  # the prompt
    labels[attention_mask == 0] = IGNORE_INDEX
    return model, {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def loss_and_gradients(criterion: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model, batch = tiny_batch()
    loss = loss_function(criterion)(model, batch)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


# slow: torch.compile of the CCE loss on a CPU (about two minutes on 2 cores); the plain-loop run below trains it
@pytest.mark.slow
def test_cce_gives_torch_s_loss_and_gradients_on_the_same_shifted_masked_labels():
    assert cce_implementation(torch.device("cpu")) == "torch_compile"
    assert cce_implementation(torch.device("cuda")) == "cce"
    cce_loss, cce_grads = loss_and_gradients("cce")
    torch_loss, torch_grads = loss_and_gradients("torch_cross_entropy")
    model_loss = tiny_batch()[0](**tiny_batch()[1]).loss  # transformers' own shift and mask
    assert cce_loss.item() == pytest.approx(torch_loss.item(), rel=1e-5)
    assert cce_loss.item() == pytest.approx(model_loss.item(), rel=1e-5)
    for name, gradient in torch_grads.items():
        torch.testing.assert_close(cce_grads[name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_cce_refuses_an_lm_head_with_a_bias():
    model, batch = tiny_batch()
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(96))
    with pytest.raises(ValueError, match="takes no LM-head bias"):
        loss_function("cce")(model, batch)


def test_only_a_cce_run_records_its_implementation():
    assert loss_details(select_loss_path("cce"), torch.device("cpu")) == {"cce_implementation": "torch_compile"}
    assert loss_details(select_loss_path("torch_cross_entropy"), torch.device("cpu")) == {}


def run(tmp_path, dataset_dir, model_dir, name: str, **overrides):
    args = dataclasses.replace(TrainingArgs(backend="plain_loop", max_steps=2), **overrides)
    planned = PlannedRun(condition_id=name, run_number=0, training_args=args, swept_axes=[])
    result = run_in_child(planned, dataset_dir, model_dir, tmp_path / name, timeout_s=500)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    return result


def test_a_plain_loop_run_of_the_cce_arm_records_cce_and_trains_as_torch_s_loss(
    tmp_path, tiny_dataset_dir, tiny_model_dir
):
    cce = run(tmp_path, tiny_dataset_dir, tiny_model_dir, "cce", arm="cce")
    reference = run(tmp_path, tiny_dataset_dir, tiny_model_dir, "torch", criterion="torch_cross_entropy")
    assert cce.loss_path == "cce" and reference.loss_path == "torch_cross_entropy"
    assert cce.details["cce_implementation"] == "torch_compile"
    assert "cce_implementation" not in reference.details
    # same seed, same batches, same weights: the same loss at every step (fp32 on a CPU)
    cce_losses = pd.read_csv(cce.steps_file)["loss"].tolist()
    reference_losses = pd.read_csv(reference.steps_file)["loss"].tolist()
    assert cce_losses == pytest.approx(reference_losses, rel=1e-4)


# slow: four runs compiling CCE's torch_compile implementation (the plain loop's run of the arm is in make test)
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf_trainer", "trl_sft"])
def test_a_trainer_run_of_the_cce_arm_trains_as_the_model_s_own_loss(
    tmp_path, tiny_dataset_dir, tiny_model_dir, backend
):
    # gradient accumulation: the Trainer normalizes by the step's labelled tokens, and so must CCE's sum
    cce = run(
        tmp_path, tiny_dataset_dir, tiny_model_dir, "cce", backend=backend, arm="cce", gradient_accumulation_steps=2
    )
    reference = run(tmp_path, tiny_dataset_dir, tiny_model_dir, "model", backend=backend, gradient_accumulation_steps=2)
    assert cce.loss_path == "cce" and reference.loss_path == "hf_cross_entropy"
    assert cce.details["cce_implementation"] == "torch_compile"
    cce_losses = pd.read_csv(cce.steps_file)["loss"].tolist()
    reference_losses = pd.read_csv(reference.steps_file)["loss"].tolist()
    assert len(cce_losses) == 2 and cce_losses == pytest.approx(reference_losses, rel=1e-4)
