"""The benchmark's axes refuse a list's usual slips with what to write instead, as the kernel benchmark's and the
frontier's list-valued settings do: null (every value commented out), a bare value, an on/off mapping, a nested list,
an item left empty; and a section left null says so."""

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, validate_experiment_args


def refusal(data) -> list[str]:
    with pytest.raises(SpecError) as error:
        ExperimentArgs.from_mapping(data)
    return error.value.problems


def test_an_axis_left_null_asks_whether_every_value_is_commented_out():
    assert refusal({"max_seq_length": None}) == [
        "experiment_args.max_seq_length is null (is every item commented out?): write a list, e.g. max_seq_length: "
        "[512, 1024], or leave max_seq_length out to use training_args' value (not swept)"
    ]


def test_a_bare_value_says_to_write_it_as_a_list():
    assert refusal({"dtype": "bfloat16", "gradient_accumulation_steps": 8}) == [
        "experiment_args.dtype must be a list, got 'bfloat16': write dtype: [bfloat16]",
        "experiment_args.gradient_accumulation_steps must be a list, got 8: write gradient_accumulation_steps: [8]",
    ]


def test_an_on_off_mapping_lists_the_values_switched_on():
    (problem,) = refusal({"optim": {"adamw_torch": True, "sgd": False, "adafactor": True}})
    assert problem.startswith("experiment_args.optim must be a list, got the mapping")
    assert "list the wanted values instead (optim: [adamw_torch, adafactor])" in problem


def test_a_nested_list_and_an_empty_item_are_named_by_their_index():
    assert refusal({"lora_rank": [[0, 8]], "backend": ["plain_loop", None]}) == [
        "experiment_args.lora_rank[0] is a nested list, [0, 8]: write the values in one flat list, e.g. lora_rank: [0]",
        "experiment_args.backend[1] is null (an item left empty, or its value commented out?): remove its line, or "
        "write it, e.g. backend: [trl_sft]",
    ]


def test_axes_built_in_python_are_held_to_the_same_shape():
    with pytest.raises(SpecError, match=r"experiment_args\.arm must be a list, got 'liger': write arm: \[liger\]"):
        validate_experiment_args(ExperimentArgs(arm="liger"))


def test_a_section_left_null_asks_whether_every_setting_is_commented_out():
    with pytest.raises(SpecError) as error:
        TrainingArgs.from_mapping(None)
    assert str(error.value) == (
        "training_args is null (is every setting under it commented out?): write its settings under it, or leave "
        "training_args out for its defaults"
    )
