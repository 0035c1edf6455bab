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
    assert problem.startswith("training_args.profile_steps 5 acts only with profiling on (profile: true)")
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


def test_every_setting_of_every_workflow_declares_where_it_acts():
    """Not only training_args: the benchmark's own settings, the frontier's sections and throughput settings and the
    kernel sweep's each declare where they act, so that the next setting added cannot slip through."""
    from finetune_bench.frontier.settings import (
        BatchSizeSearch,
        FrontierArm,
        ProbeSettings,
        SeqLengthSearch,
        ThroughputRuns,
    )
    from finetune_bench.inputs.plan import PredictionTarget, RunSettings
    from finetune_bench.inputs.rules import undeclared
    from finetune_bench.kernels.settings import KernelBenchmarkSettings

    sections = [RunSettings, PredictionTarget, FrontierArm, BatchSizeSearch, SeqLengthSearch, ProbeSettings]
    missing = {cls.__name__: undeclared(cls) for cls in [*sections, ThroughputRuns, KernelBenchmarkSettings]}
    assert not any(missing.values()), f"declare where each acts (acts_only or acts_everywhere): {missing}"


def test_a_workflow_setting_that_acts_in_nothing_it_runs_is_refused():
    from finetune_bench.inputs.plan import PredictionTarget, RunSettings, Workload, check_workflow_settings_act

    cpu_forward = Workload.of([TrainingArgs(device="cpu", backend="forward_only")], gpu_here=False)
    with pytest.raises(SpecError) as refused:
        check_workflow_settings_act(
            [RunSettings(), PredictionTarget(gpu_hour_price=2.5, fine_tune_steps=300)], cpu_forward
        )
    price, steps = refused.value.problems
    assert price.startswith("gpu_hour_price 2.5 acts only where a run trains on a GPU")
    assert steps.startswith("fine_tune_steps 300 acts only where a condition trains")
    # device auto where a GPU is (a cluster's pods), or a dry run that predicts for one: the price acts
    check_workflow_settings_act([PredictionTarget(gpu_hour_price=2.5)], Workload.of([TrainingArgs()], gpu_here=True))
    dry = Workload.of([TrainingArgs(device="cpu")], gpu_here=False, target_gpu=True)
    check_workflow_settings_act([PredictionTarget(gpu_hour_price=2.5)], dry)


def test_the_frontier_refuses_what_acts_only_where_its_search_or_throughput_runs_do():
    from finetune_bench.frontier.planning import check_sections_act, check_throughput_settings
    from finetune_bench.frontier.settings import BatchSizeSearch

    with pytest.raises(SpecError) as refused:
        check_sections_act(BatchSizeSearch(enabled=False, start=4))
    (problem,) = refused.value.problems
    assert problem.startswith("batch_size_search.start 4 acts only with the search enabled (enabled: true)")
    check_sections_act(BatchSizeSearch(enabled=False))
    # throughput runs come only from a batch-size search: their repeats and timeout act nowhere without one
    with pytest.raises(SpecError) as refused:
        check_throughput_settings(n_runs=3, condition_timeout_s=600, batch_size_search=BatchSizeSearch(enabled=False))
    assert [p.split(" acts only")[0] for p in refused.value.problems] == ["n_runs 3", "condition_timeout_s 600"]
    check_throughput_settings(measure_throughput=False, batch_size_search=BatchSizeSearch(enabled=False))
    check_throughput_settings(n_runs=3, condition_timeout_s=600)


def test_a_kernel_timeout_below_the_floor_is_refused_before_any_kernel_runs():
    from finetune_bench.kernels.settings import KernelBenchmarkSettings

    with pytest.raises(SpecError, match=r"sweep.timeout_s 1 is in seconds: .* write at least 30"):
        KernelBenchmarkSettings(timeout_s=1).check()


def test_a_fine_tune_that_fills_no_step_or_would_make_the_projection_slow_is_refused_at_planning():
    from finetune_bench.prediction.fine_tune import MAX_DRAWN_ROWS, check_fine_tune_fills

    few = TrainingArgs(synthetic_num_examples=16, per_device_train_batch_size=8, gradient_accumulation_steps=4)
    with pytest.raises(SpecError) as refused:
        check_fine_tune_fills([few], 1.5, 0)
    (problem,) = refused.value.problems
    assert problem.startswith("fine_tune_epochs 1.5: 16 training rows (training_args.synthetic_num_examples less")
    assert "fill no optimizer step of 32 rows" in problem
    check_fine_tune_fills([few], 1.0, 0)  # left at its default: measured, and said not to project
    # packed, the rows are at most the examples: fewer than a step's, whatever the packing
    with pytest.raises(SpecError, match=r"^fine_tune_epochs 1.5: 16 training rows .* \(packed: at most as many rows\)"):
        check_fine_tune_fills([dataclasses_replace(few, packing=True)], 1.5, 0)
    many = TrainingArgs(synthetic_num_examples=64, per_device_train_batch_size=8)
    with pytest.raises(SpecError, match=f"more than the {MAX_DRAWN_ROWS:,} the projection draws at most"):
        check_fine_tune_fills([many], 1.0, MAX_DRAWN_ROWS // 8 + 1)
    check_fine_tune_fills([many], 1.0, MAX_DRAWN_ROWS // 8)


def test_the_projection_bounds_its_own_work_where_planning_could_not():
    import numpy as np

    from finetune_bench.prediction.fine_tune import MAX_DRAWN_ROWS, Batching, FineTune, NotProjected, schedule

    rows = np.full(1000, 64)
    with pytest.raises(NotProjected, match="the projection draws at most"):
        schedule(rows, Batching(batch_size=8), FineTune(epochs=MAX_DRAWN_ROWS // 1000 + 1))


def dataclasses_replace(args, **changes):
    import dataclasses

    return dataclasses.replace(args, **changes)


def test_a_local_run_s_target_gpu_of_another_size_without_a_cap_is_refused():
    """gpu_memory_gib (the GPU a plan predicts for) written in a local run where gpu_memory_cap_gib was meant."""
    from finetune_bench.inputs.machine import check_target_is_this_gpu

    h200 = (["NVIDIA H200"], 139.8 * 2**30)
    with pytest.raises(SpecError) as refused:
        check_target_is_this_gpu(40.0, [TrainingArgs(device="cuda")], *h200)
    (problem,) = refused.value.problems
    assert problem.startswith("gpu_memory_gib 40 predicts for a 40 GiB GPU, and the runs train uncapped on this NVIDIA")
    assert "set training_args.gpu_memory_cap_gib: 40" in problem and "set dry_run: true" in problem
    check_target_is_this_gpu(40.0, [TrainingArgs(device="cuda", gpu_memory_cap_gib=40.0)], *h200)  # capped: meant
    check_target_is_this_gpu(139.8, [TrainingArgs(device="cuda")], *h200)  # this GPU
    check_target_is_this_gpu(40.0, [TrainingArgs(device="cuda")], [], None)  # no GPU here: nothing to compare


def test_the_epochs_beside_steps_a_cpu_grid_s_prediction_target_and_a_short_probe_timeout_are_refused():
    from finetune_bench.frontier.settings import ProbeSettings
    from finetune_bench.inputs.plan import PredictionTarget, Workload, check_workflow_settings_act
    from finetune_bench.prediction.fine_tune import check_fine_tune

    with pytest.raises(SpecError, match=r"^fine_tune_epochs 3 with fine_tune_steps 500: the steps decide"):
        check_fine_tune(3.0, 500)
    check_fine_tune(1.0, 500)  # the epochs left at their default
    cpu = Workload.of([TrainingArgs(device="cpu")], gpu_here=False)
    with pytest.raises(SpecError) as refused:
        check_workflow_settings_act([PredictionTarget(gpu_kind="H100", skip_predicted_oom=True)], cpu)
    assert [p.split(" acts only")[0] for p in refused.value.problems] == ["gpu_kind 'H100'", "skip_predicted_oom True"]
    auto = Workload.of([TrainingArgs(device="auto")], gpu_here=False)  # a dry run's plan on a laptop predicts
    check_workflow_settings_act([PredictionTarget(gpu_kind="H100", skip_predicted_oom=True)], auto)
    with pytest.raises(SpecError, match="probes.timeout_s must be at least 30, got 10"):
        ProbeSettings(timeout_s=10).check()


def test_a_kernel_sweep_s_repeated_names_and_a_cuda_device_without_a_gpu_are_refused():
    from finetune_bench.kernels.settings import KernelBenchmarkSettings, check_device_here

    with pytest.raises(SpecError, match=r"^sweep.modes repeats 'forward': list each once$"):
        KernelBenchmarkSettings(modes=["forward", "forward", "full"]).check()
    with pytest.raises(SpecError, match=r"^sweep.kernels repeats 'rms_norm': list each once$"):
        KernelBenchmarkSettings(kernels=["rms_norm", "swiglu", "rms_norm"]).check()
    with pytest.raises(SpecError, match=r"^sweep.device 'cuda': this machine has no GPU"):
        check_device_here(KernelBenchmarkSettings(device="cuda"), [])
    check_device_here(KernelBenchmarkSettings(device="cuda"), ["NVIDIA H200"])
    check_device_here(KernelBenchmarkSettings(device="auto"), [])


def test_alpha_acts_only_where_a_test_is_run_at_it():
    """The significance level of the tests of an arm against the baseline, or of a software set against the reference
    set: with the baseline arm alone no test is run."""
    from finetune_bench.inputs.plan import RunSettings, Workload, check_workflow_settings_act

    def workload(**axes) -> Workload:
        return Workload.of([run.training_args for run in plan_runs(ExperimentArgs(**axes), TrainingArgs(), 1)], False)

    with pytest.raises(SpecError) as refused:
        check_workflow_settings_act([RunSettings(alpha=0.01)], workload(arm=["baseline"]))
    (problem,) = refused.value.problems
    assert problem.startswith("alpha 0.01 acts only where a test is run at it: an arm's runs against the baseline's")
    assert problem.endswith("leave it at its default (0.05) or set what it acts with")
    for tested in (dict(arm=["liger", "baseline"]), dict(arm=["baseline", "baseline_repeat"])):
        check_workflow_settings_act([RunSettings(alpha=0.01)], workload(**tested))
    check_workflow_settings_act([RunSettings(alpha=0.01)], workload(arm=[], software_set=["", "liger-kernel==0.8.2"]))
    check_workflow_settings_act([RunSettings()], workload(arm=["baseline"]))  # left at its default


def test_a_packed_fine_tune_of_too_few_epochs_is_refused_naming_the_epochs_and_the_note_names_them_too():
    """Packing joins examples into at most as many rows (each truncated to max_seq_length): a fraction of an epoch
    that fills no step even then fills none; the projection's note, where planning could not tell, says the same."""
    import numpy as np

    from finetune_bench.prediction.fine_tune import FineTune, NotProjected, batching_of, check_fine_tune_fills, schedule

    packed = TrainingArgs(synthetic_num_examples=32, per_device_train_batch_size=1, packing=True)
    with pytest.raises(SpecError) as refused:
        check_fine_tune_fills([packed], 0.001, 0)
    (problem,) = refused.value.problems
    assert problem == (
        "fine_tune_epochs 0.001 fills no optimizer step: an epoch of at most 32 training rows (packed: at most one row "
        "an example) is at most 32 micro-batches (1 row each on 1 rank(s), 1 a step), so nothing would be projected; "
        "set fine_tune_epochs to at least 0.0313, or fine_tune_steps to the optimizer steps you plan"
    )
    check_fine_tune_fills([packed], 0.0313, 0)
    check_fine_tune_fills([packed], 1.0, 3)
    with pytest.raises(NotProjected, match=r"^fine_tune_epochs 0.001 fills no optimizer step: an epoch of 32 training"):
        schedule(np.full(32, 16), batching_of(packed), FineTune(epochs=0.001))
    assert schedule(np.full(32, 16), batching_of(packed), FineTune(epochs=0.0313)).steps == 1
