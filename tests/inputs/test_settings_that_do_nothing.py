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


@pytest.mark.parametrize(
    ("experiment", "training", "refused"),
    [
        (
            ExperimentArgs(),
            TrainingArgs(backend="plain_loop", ddp_bucket_cap_mb=100),
            "training_args.ddp_bucket_cap_mb 100",
        ),
        (ExperimentArgs(), TrainingArgs(backend="hf_trainer", lora_dropout=0.1), "training_args.lora_dropout 0.1"),
        (
            ExperimentArgs(learning_rate=[1e-5, 3e-5]),
            TrainingArgs(backend="forward_only"),
            "experiment_args.learning_rate 1e-05, 3e-05",
        ),
        (
            ExperimentArgs(),
            TrainingArgs(warmup_ratio=0.1, lr_scheduler_type="constant"),
            "training_args.warmup_ratio 0.1",
        ),
        (ExperimentArgs(), TrainingArgs(dataset_split="train[:100]"), "training_args.dataset_split 'train[:100]'"),
        (
            ExperimentArgs(num_gpus=[1]),
            TrainingArgs(backend="plain_loop", parallelism="fsdp"),
            "training_args.parallelism 'fsdp'",
        ),
        (
            ExperimentArgs(),
            TrainingArgs(dataset_name="tatsu-lab/alpaca", synthetic_num_examples=64),
            "training_args.synthetic_num_examples 64",
        ),
    ],
)
def test_a_setting_that_acts_in_no_condition_of_the_grid_is_refused(experiment, training, refused):
    """Where each setting acts is declared beside its field; set in a grid where it acts nowhere, it is refused."""
    found = [problem for problem in problems(experiment, training) if problem.startswith(refused)]
    assert len(found) == 1, problems(experiment, training)
    assert " acts only " in found[0] and "so it would change nothing; leave it at its default" in found[0]


def test_a_setting_that_acts_in_some_conditions_is_kept():
    """The one-GPU point of a GPU-count sweep trains without DDP, the others with it; LoRA settings beside a rank
    sweep that includes a full fine-tune."""
    plan_runs(
        ExperimentArgs(num_gpus=[1, 2]), TrainingArgs(backend="plain_loop", parallelism="ddp", ddp_bucket_cap_mb=100), 1
    )
    plan_runs(ExperimentArgs(lora_rank=[0, 16]), TrainingArgs(backend="hf_trainer", lora_alpha=32), 1)
    plan_runs(ExperimentArgs(), TrainingArgs(warmup_ratio=0.1, lr_scheduler_type="constant_with_warmup"), 1)


def test_every_training_setting_declares_where_it_acts():
    """Every field of training_args declares where it acts (`rules.acts_only`, or `rules.acts_everywhere`): a setting
    added without a declaration fails here, so none can act in no condition of a grid unrefused."""
    import dataclasses

    from finetune_bench.inputs.rules import field_scope

    undeclared = [f.name for f in dataclasses.fields(TrainingArgs) if field_scope(f) is None]
    assert not undeclared, f"declare where each acts (acts_only or acts_everywhere): {undeclared}"


def test_held_out_settings_without_held_out_examples_and_a_config_of_generated_data_are_refused():
    with pytest.raises(SpecError) as refused:
        plan_runs(ExperimentArgs(), TrainingArgs(per_device_eval_batch_size=16, dataset_config="main"), 1)
    problems = " ".join(refused.value.problems)
    assert "training_args.per_device_eval_batch_size 16 acts only with held-out examples" in problems
    assert "training_args.dataset_config 'main' acts only with a hub or local dataset" in problems
