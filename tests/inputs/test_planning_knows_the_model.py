"""What a run would only find out by crashing, refused at planning from the model's config: an activation or a
scheduler transformers does not know, a probability outside [0, 1], a vocabulary below the tokenizer's, a position
table shorter than the sequences, LoRA targets that name no module."""

import pytest

from finetune_bench.inputs import model_checks
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.model_overrides import check_model_config_overrides
from finetune_bench.inputs.settings import TrainingArgs


def problems(check) -> list[str]:
    with pytest.raises(SpecError) as error:
        check()
    return error.value.problems


def test_transformers_names_are_read_from_its_source_as_its_modules_have_them():
    from transformers.activations import ACT2FN
    from transformers.trainer_utils import SchedulerType

    assert set(model_checks.activation_names()) == set(ACT2FN)
    assert model_checks.scheduler_types() == tuple(s.value for s in SchedulerType)


def test_a_vocabulary_below_the_random_models_tokenizer_is_refused_and_one_at_its_size_is_not():
    (problem,) = problems(lambda: check_model_config_overrides("random:tiny-llama", "vocab_size=1000"))
    assert "vocab_size=1000 is smaller than the 1,024 tokens of 'random:tiny-llama''s tokenizer" in problem
    check_model_config_overrides("random:tiny-llama", "vocab_size=1024")
    check_model_config_overrides("random:tiny-llama", "vocab_size=4096")


def test_activation_and_probability_values_are_checked_for_a_hub_model_too():
    found = problems(
        lambda: check_model_config_overrides("meta-llama/Llama-3.2-1B", "hidden_act=gelu_fancy,attention_dropout=-0.1")
    )
    assert found[0].startswith("training_args.model_config_overrides: hidden_act=gelu_fancy is not an activation")
    assert "(did you mean 'gelu_fast'?)" in found[0]
    assert "attention_dropout=-0.1 is a probability: it must be in [0, 1]" in found[1]
    check_model_config_overrides("random:tiny-llama", "hidden_act=gelu_pytorch_tanh,attention_dropout=0.1")


def test_a_sequence_longer_than_gpt2s_position_table_is_refused():
    gpt2 = TrainingArgs(model_name="random:tiny-gpt2", backend="plain_loop", max_seq_length=1025)
    (problem,) = problems(lambda: validate_condition(gpt2, {"max_seq_length": 1025}))
    assert (
        "max_seq_length 1025 is longer than the 1024 absolute positions of 'random:tiny-gpt2' (n_positions)" in problem
    )
    assert "(condition max_seq_length=1025)" in problem
    validate_condition(TrainingArgs(model_name="random:tiny-gpt2", backend="plain_loop", max_seq_length=1024), {})
    widened = TrainingArgs(
        model_name="random:tiny-gpt2",
        backend="plain_loop",
        max_seq_length=2048,
        model_config_overrides="n_positions=2048",
    )
    validate_condition(widened, {})


@pytest.mark.parametrize(
    ("model", "targets", "missing"),
    [("random:tiny-llama", "q_proj,c_attn", "c_attn"), ("random:tiny-gpt2", "c_attn,q_proj", "q_proj")],
)
def test_lora_targets_that_match_no_module_are_named_with_the_models_linear_layers(model, targets, missing):
    args = TrainingArgs(model_name=model, backend="hf_trainer", lora_rank=8, lora_target_modules=targets)
    (problem,) = problems(lambda: validate_condition(args, {}))
    assert f"{missing!r} matches no module of {model!r}" in problem
    assert "its linear layers: " in problem


def test_lora_targets_that_match_pass_and_a_hub_model_is_not_built():
    for targets in ("all-linear", "q_proj,v_proj", "self_attn.q_proj"):
        validate_condition(
            TrainingArgs(
                model_name="random:tiny-llama", backend="hf_trainer", lora_rank=8, lora_target_modules=targets
            ),
            {},
        )
    # A hub model's config comes with its download: its targets are left to the run.
    hub = TrainingArgs(model_name="org/model", backend="hf_trainer", lora_rank=8, lora_target_modules="nothing_here")
    validate_condition(hub, {})


def test_an_unknown_scheduler_is_refused_naming_transformers_ones():
    (problem,) = problems(lambda: TrainingArgs.from_mapping({"lr_scheduler_type": "cosin"}))
    assert problem.startswith("training_args.lr_scheduler_type: 'cosin' is not a scheduler transformers knows")
    assert "(did you mean 'cosine'?)" in problem
    TrainingArgs.from_mapping({"lr_scheduler_type": "warmup_stable_decay"})
