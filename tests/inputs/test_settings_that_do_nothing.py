"""Settings that would silently change nothing are refused at planning: evaluations every more steps than a run
has, profiled steps without profiling, one set of model overrides swept twice in two spellings."""

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.model_overrides import canonical_overrides
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs


def problems(experiment: ExperimentArgs, training: TrainingArgs) -> list[str]:
    with pytest.raises(SpecError) as error:
        plan_runs(experiment, training, 1)
    return error.value.problems


def test_eval_steps_beyond_max_steps_is_refused_and_at_max_steps_is_not():
    (problem,) = problems(ExperimentArgs(), TrainingArgs(eval_examples=8, eval_steps=5, max_steps=4))
    assert problem.startswith("training_args.eval_steps (5) is larger than max_steps (4)")
    plan_runs(ExperimentArgs(), TrainingArgs(eval_examples=8, eval_steps=4, max_steps=4), 1)


def test_profile_steps_without_profile_is_refused():
    (problem,) = problems(ExperimentArgs(), TrainingArgs(profile_steps=5))
    assert problem.startswith("training_args.profile_steps (5) with profile false")
    plan_runs(ExperimentArgs(), TrainingArgs(profile_steps=5, profile=True), 1)


def test_override_strings_are_compared_as_what_they_set():
    assert canonical_overrides(" rope_theta=5.0e5 ,num_hidden_layers=1") == canonical_overrides(
        "num_hidden_layers=1,rope_theta=500000.0"
    )
    assert canonical_overrides("use_cache=true") != canonical_overrides("use_cache=1")
    assert canonical_overrides("num_hidden_layers=1") != canonical_overrides("num_hidden_layers=2")


def test_one_set_of_overrides_swept_in_two_spellings_is_refused():
    sweep = ExperimentArgs(
        model_config_overrides=["num_hidden_layers=1 , rope_theta=5.0e5", "rope_theta=500000.0,num_hidden_layers=1"]
    )
    (problem,) = problems(sweep, TrainingArgs())
    assert "set the same overrides (spaces, order and the spelling of a number do not count)" in problem
    plan_runs(
        ExperimentArgs(model_config_overrides=["num_hidden_layers=1", "num_hidden_layers=2", ""]), TrainingArgs(), 1
    )
