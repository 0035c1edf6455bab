"""A refused value hides no other problem of its section: every refused value of an axis is named, and the checks
across a section's settings still run on what reads, never reading a refused value (left at its default)."""

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


def refusal(cls, data) -> list[str]:
    with pytest.raises(SpecError) as error:
        cls.from_mapping(data)
    return error.value.problems


def test_every_refused_arm_of_the_axis_is_named():
    found = refusal(ExperimentArgs, {"arm": ["liger", "compyle", "baseline+cce", "liger:ropee"]})
    assert [p[: p.index("':") + 1] for p in found] == [
        "experiment_args.arm: arm 'compyle'",
        "experiment_args.arm: arm 'baseline+cce'",
        "experiment_args.arm: arm 'liger:ropee'",
    ]


def test_a_refused_setting_does_not_hide_the_checks_across_the_others():
    found = refusal(
        TrainingArgs,
        {
            "lr_scheduler_type": "cosine_annealing",
            "timing_warmup_steps": 9,
            "synthetic_min_words": 60,
            "synthetic_max_words": 20,
            "model_config_overrides": "attention_dropout=1.5",
        },
    )
    assert found[0].startswith("training_args.lr_scheduler_type: 'cosine_annealing' is not a scheduler")
    assert found[1:] == [
        "training_args.synthetic_min_words must not exceed synthetic_max_words (60 > 20)",
        "training_args.timing_warmup_steps (9) must be below max_steps (4): no step would be measured",
        "training_args.model_config_overrides: attention_dropout=1.5 is a probability: it must be in [0, 1] (e.g. "
        "attention_dropout=0.1)",
    ]


def test_an_unknown_key_does_not_hide_the_checks_across_the_others():
    found = refusal(TrainingArgs, {"max_stepz": 3, "timing_warmup_steps": 9})
    assert found == [
        "training_args.max_stepz is not a setting (did you mean 'max_steps'?)",
        "training_args.timing_warmup_steps (9) must be below max_steps (4): no step would be measured",
    ]


def test_a_check_across_settings_never_reads_a_refused_value():
    found = refusal(TrainingArgs, {"max_steps": "four", "timing_warmup_steps": 9, "model_name": "random:tiny_llama"})
    assert found[0] == "training_args.max_steps must be int, got 'four'"
    assert not any("timing_warmup_steps" in p for p in found), "max_steps is not its default 4 in the user's file"
    assert any(p.startswith("training_args.model_name: no bundled architecture 'tiny_llama'") for p in found)
    assert len(found) == 2
