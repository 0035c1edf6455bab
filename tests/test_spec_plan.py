import dataclasses

import pytest

from finetune_bench.plan import plan_runs
from finetune_bench.spec import ExperimentArgs, SpecError, TrainingArgs, axis_names


def test_every_axis_is_a_training_setting():
    training_fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    assert set(axis_names()) <= training_fields
    assert {"use_liger", "per_device_train_batch_size"} <= set(axis_names())


def test_plan_crosses_swept_axes_and_interleaves_repeats():
    experiment = ExperimentArgs(use_liger=[True, False], per_device_train_batch_size=[4, 8], max_seq_length=[128, 256])
    runs = plan_runs(experiment, TrainingArgs(), n_runs=3)
    assert len(runs) == 2 * 2 * 2 * 3
    # all conditions of repeat 0 come before any of repeat 1
    assert [r.run_number for r in runs] == sorted(r.run_number for r in runs)
    first_repeat = runs[:8]
    assert len({r.condition_id for r in first_repeat}) == 8
    for run in runs:
        assert run.swept_axes == ["use_liger", "per_device_train_batch_size", "max_seq_length"]
        assert f"per_device_train_batch_size={run.training_args.per_device_train_batch_size}" in run.condition_id
    # settings that are not swept come from training_args
    assert {r.training_args.model_name for r in runs} == {TrainingArgs().model_name}


def test_unswept_axis_keeps_training_value():
    runs = plan_runs(ExperimentArgs(use_liger=[True, False], per_device_train_batch_size=[]), TrainingArgs(), 1)
    assert [r.condition_id for r in runs] == ["use_liger=True", "use_liger=False"]
    assert all(r.training_args.per_device_train_batch_size == TrainingArgs().per_device_train_batch_size for r in runs)


@pytest.mark.parametrize(
    "experiment, training, n_runs, key",
    [
        (
            ExperimentArgs(per_device_train_batch_size=[0, 8]),
            TrainingArgs(),
            1,
            "experiment_args.per_device_train_batch_size",
        ),
        (
            ExperimentArgs(per_device_train_batch_size=[4, 4]),
            TrainingArgs(),
            1,
            "experiment_args.per_device_train_batch_size",
        ),
        (ExperimentArgs(use_liger=["yes"]), TrainingArgs(), 1, "experiment_args.use_liger"),
        (ExperimentArgs(), TrainingArgs(max_seq_length=-1), 1, "training_args.max_seq_length"),
        (ExperimentArgs(), TrainingArgs(dtype="fp8"), 1, "training_args.dtype"),
        (ExperimentArgs(), TrainingArgs(max_steps="10"), 1, "training_args.max_steps"),
        (ExperimentArgs(), TrainingArgs(timing_warmup_steps=4, max_steps=4), 1, "timing_warmup_steps"),
        (ExperimentArgs(), TrainingArgs(warmup_ratio=1.5), 1, "training_args.warmup_ratio"),
        (ExperimentArgs(), TrainingArgs(), 0, "n_runs"),
    ],
)
def test_bad_inputs_name_the_key(experiment, training, n_runs, key):
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        plan_runs(experiment, training, n_runs)


def test_a_criterion_its_backend_cannot_run_is_rejected_with_the_condition():
    experiment = ExperimentArgs(backend=["trl_sft", "plain_loop"], criterion=["trl"])
    with pytest.raises(SpecError, match=r"criterion 'trl' does not run with backend 'plain_loop'.*backend=plain_loop"):
        plan_runs(experiment, TrainingArgs(), 1)
    runs = plan_runs(
        ExperimentArgs(backend=["plain_loop"], criterion=["model", "liger_cross_entropy"]), TrainingArgs(), 1
    )
    assert [r.training_args.criterion for r in runs] == ["model", "liger_cross_entropy"] * 4
