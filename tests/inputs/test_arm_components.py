"""The arm components beyond Liger's defaults: a set of Liger kernels, Liger without its loss kernels, and torchao's
float8 training; what the grammar and planning accept and refuse, and what the plan says about them."""

import dataclasses
import importlib.metadata
import importlib.util

import pytest

from finetune_bench.inputs.arms import ArmError, component_notes, default_kernels, parse_arm, uncompiled_layers_problem
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import ConditionRefused, SpecError
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction.memory import resolve_step
from finetune_bench.prediction.shapes import NoPrediction, model_config, model_shape


def condition(**overrides) -> TrainingArgs:
    return dataclasses.replace(TrainingArgs(backend="plain_loop", model_name="random:tiny-llama"), **overrides)


def refusal(**overrides) -> str:
    with pytest.raises(SpecError) as refused:
        validate_condition(condition(**overrides), {})
    return str(refused.value)


def test_a_set_of_liger_kernels_switches_on_those_and_nothing_else():
    arm = parse_arm("liger:rope,rms_norm")
    assert arm.liger_kernel_names("llama") == ("rope", "rms_norm")
    flags = arm.liger_flags("llama")
    assert {k for k, on in flags.items() if on} == {"rope", "rms_norm"}
    assert set(flags) == set(parse_arm("liger:swiglu").liger_flags("llama"))  # every switch named


def test_liger_without_loss_is_liger_s_defaults_minus_its_loss_kernels():
    arm = parse_arm("liger-without-loss")
    defaults = set(default_kernels("llama"))
    assert "fused_linear_cross_entropy" in defaults  # so the component changes something for Llama
    on = {k for k, v in arm.liger_flags("llama").items() if v}
    assert on == defaults - {"cross_entropy", "fused_linear_cross_entropy"} and on
    assert arm.components == ("liger-without-loss",)
    assert parse_arm("liger-without-loss+cce").components == ("liger-without-loss", "cce")


def test_a_liger_kernel_the_model_type_lacks_is_named_for_the_condition():
    with pytest.raises(ArmError, match=r"no 'geglu' kernel for model type 'llama'"):
        parse_arm("liger:rope,geglu").liger_flags("llama")


@pytest.mark.parametrize(
    "name, message",
    [
        ("liger+liger-without-loss", "both choose Liger's kernels"),
        ("liger:rope,rope", "names a Liger kernel twice"),
        ("liger:rope,", r"no kernel ''"),
        ("liger:rope,fused_linear_cross_entropy+cce", "both compute the loss.*'liger-without-loss\\+cce'"),
        ("float8:rope", "only liger takes kernels"),
        ("float", r"unknown component 'float' \(did you mean 'float8'\?\)"),
        ("liger-without-loss:rope", "only liger takes kernels"),
    ],
)
def test_meaningless_component_spellings_are_refused(name, message):
    with pytest.raises(ArmError, match=message):
        parse_arm(name)


@pytest.mark.parametrize("arm", ["float8", "float8+compile", "liger-without-loss+float8+compile", "float8+cce"])
def test_float8_plans_for_a_full_fine_tune_on_a_gpu(arm):
    validate_condition(condition(arm=arm, device="cuda"), {})
    validate_condition(condition(arm=arm, device="auto", backend="hf_trainer"), {})


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_float8_plans_on_several_gpus_with_the_plain_loop_and_is_refused_with_a_trainer(parallelism):
    several = {"device": "cuda", "num_gpus": 4, "parallelism": parallelism}
    validate_condition(condition(arm="float8+compile", **several), {})
    refused = refusal(arm="float8+compile", backend="trl_sft", **several)
    assert "with 4 GPUs and backend 'trl_sft'" in refused and "runs with backend 'plain_loop'" in refused


def test_float8_is_refused_with_lora_on_a_cpu_and_beside_switchback():
    assert "LoRA trains adapters beside frozen weights" in refusal(arm="float8", backend="hf_trainer", lora_rank=8)
    assert "needs a CUDA GPU of compute capability 8.9" in refusal(arm="float8", device="cpu")
    assert "both replace the linear layers' matmuls" in refusal(arm="float8+switchback", device="cuda")


def test_float8_without_torchao_is_refused_with_the_install_hint(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real_find_spec(name, *a)
    )
    assert "needs the package torchao" in refusal(arm="float8+compile", device="cuda")
    validate_condition(condition(arm="compile", device="cuda"), {})  # nothing else asks for it


def test_the_plan_notes_float8_run_eager_once():
    notes = component_notes(["float8", "float8", "float8+compile", "baseline"])
    assert len(notes) == 1 and "arm 'float8'" in notes[0] and "'float8+compile' is the fast form" in notes[0]
    assert component_notes(["float8+compile", "liger"]) == []


def test_the_memory_model_says_why_it_does_not_predict_float8():
    shape = model_shape(model_config("random:tiny-llama"))
    with pytest.raises(NoPrediction, match="float8 training's casts"):
        resolve_step(condition(arm="float8+compile", device="cuda"), shape, True)
    # liger-without-loss is predicted, with its layer kernels only
    step = resolve_step(condition(arm="liger-without-loss", device="cuda"), shape, True)
    assert "fused_linear_cross_entropy" not in step.kernels and "rms_norm" in step.kernels


@pytest.mark.parametrize("backend", ["plain_loop", "hf_trainer", "trl_sft"])
def test_float16_trains_in_mixed_precision_except_sharded_with_fsdp(backend):
    for device in ("cuda", "cpu"):
        validate_condition(condition(backend=backend, dtype="float16", device=device), {})
    validate_condition(condition(backend=backend, dtype="float16", device="cuda", num_gpus=2, parallelism="ddp"), {})
    message = refusal(backend=backend, dtype="float16", device="cuda", num_gpus=2, parallelism="fsdp")
    assert message.startswith("training_args.dtype 'float16' with parallelism 'fsdp'")
    assert "use parallelism 'ddp', or dtype 'bfloat16' with 'fsdp'" in message
    # the one-GPU point of a GPU-count sweep trains without a process group: nothing is sharded
    validate_condition(condition(backend=backend, dtype="float16", device="cuda", parallelism="fsdp"), {"num_gpus": 1})
    validate_condition(condition(backend=backend, dtype="bfloat16", device="cuda", num_gpus=2, parallelism="fsdp"), {})


def test_float16_lora_and_forward_passes_plan():
    validate_condition(condition(backend="hf_trainer", dtype="float16", device="cuda", lora_rank=8), {})
    validate_condition(condition(backend="forward_only", dtype="float16", device="cuda"), {})


SHARDED_AND_CHECKPOINTED = {"device": "cuda", "num_gpus": 4, "parallelism": "fsdp", "gradient_checkpointing": True}


def transformers_installed_as(monkeypatch, version: str) -> None:
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version if name == "transformers" else real_version(name)
    )


def test_a_compiled_arm_is_refused_under_fsdp2_with_checkpointing_where_transformers_leaves_its_layers_uncompiled(
    monkeypatch,
):
    transformers_installed_as(monkeypatch, "5.17.0")
    with pytest.raises(ConditionRefused) as refused:
        validate_condition(condition(arm="float8+compile", **SHARDED_AND_CHECKPOINTED), {})
    message = str(refused.value)
    assert "arm 'float8+compile'" in message
    assert "transformers 5.17.0 (installed) checkpoints each decoder layer's __call__" in message
    assert "install transformers 5.23.0 or later" in message
    assert "set training_args.gradient_checkpointing false" in message
    # what compiles its layers with that release: no checkpointing, DDP (no hooks per layer), an arm not compiled
    validate_condition(condition(arm="compile", **{**SHARDED_AND_CHECKPOINTED, "gradient_checkpointing": False}), {})
    validate_condition(condition(arm="compile", **{**SHARDED_AND_CHECKPOINTED, "parallelism": "ddp"}), {})
    validate_condition(condition(arm="liger", **SHARDED_AND_CHECKPOINTED), {})
    # the one-GPU point of a scaling grid shards nothing
    validate_condition(condition(arm="compile", **{**SHARDED_AND_CHECKPOINTED, "num_gpus": 1}), {"num_gpus": 1})


@pytest.mark.parametrize(
    ("version", "refused"),
    [("5.22.2", True), ("4.57.6", True), ("5.23.0", False), ("5.23.0.dev0", False), ("5.23.0rc1", False),
     ("5.24.0+local", False), ("not a version", False)],
)  # fmt: skip
def test_which_transformers_releases_leave_compiled_layers_uncompiled(version, refused):
    problem = uncompiled_layers_problem(parse_arm("compile"), True, True, version)
    assert (problem is not None) == refused
    assert uncompiled_layers_problem(parse_arm("compile"), False, True, "5.17.0") is None


def test_a_software_set_s_transformers_decides_whether_its_compiled_layers_are_refused(monkeypatch):
    transformers_installed_as(monkeypatch, "5.23.0")
    validate_condition(condition(arm="compile", **SHARDED_AND_CHECKPOINTED), {})
    with pytest.raises(ConditionRefused, match=r"transformers 5.22.2 \(the software set's pin\) checkpoints"):
        validate_condition(
            condition(arm="compile", software_set="transformers==5.22.2", **SHARDED_AND_CHECKPOINTED), {}
        )
    transformers_installed_as(monkeypatch, "5.17.0")
    validate_condition(condition(arm="compile", software_set="transformers==5.23.0", **SHARDED_AND_CHECKPOINTED), {})


def test_a_run_whose_imported_transformers_would_leave_its_compiled_layers_uncompiled_fails_before_loading(
    monkeypatch, tmp_path
):
    import torch
    import transformers

    from finetune_bench.running.backends.common import load_model

    monkeypatch.setattr(transformers, "__version__", "5.22.2")
    args = condition(arm="compile", **{**SHARDED_AND_CHECKPOINTED, "device": "cpu"})
    with pytest.raises(
        RuntimeError, match=r"transformers 5.22.2 \(imported\) checkpoints each decoder layer's __call__"
    ):
        load_model(args, tmp_path / "no model here", torch.device("cpu"), torch.float32)
