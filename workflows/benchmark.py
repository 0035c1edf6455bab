"""The benchmark workflow: arms (baseline, liger, ...) × swept settings × repeats, measured and reported.

pyflyte run workflows/benchmark.py benchmarking_experiment --inputs-file inputs/smoke.yaml
union run --remote workflows/benchmark.py benchmarking_experiment --inputs-file inputs/phi3_alpaca.yaml
"""

from functools import partial

import pandas as pd
from flytekit import conditional, map_task, workflow
from flytekit.extras.accelerators import GPUAccelerator
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.inputs.plan import BenchmarkPlan, PlannedRun, RunSettings
from finetune_bench.inputs.reading import check_n_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, smoke_experiment
from finetune_bench.inputs.validation import validate_run_settings
from finetune_bench.prediction.fine_tune import check_fine_tune
from finetune_bench.prediction.gpus import accelerator_name
from finetune_bench.sources.versions import SourceVersions
from images import training_image
from tasks.analysis import analyze_results, require_nothing_lost
from tasks.data import check_training_data, download_sources
from tasks.dynamic import dynamic_node
from tasks.inputs_yaml import inputs_file_argument, read_inputs_whole, require_unique_keys
from tasks.plan import check_prediction_settings, plan_benchmark, report_plan
from tasks.records import TrainOutput
from tasks.registration import REGISTRATION_ENV
from tasks.software_images import define_set_train_tasks, registered_image
from tasks.train import concatenate_outputs, runs_by_layout_and_set, train_condition
from workflows.console import quiet_console

# Before the CLI reads --inputs-file: a key given twice is an error, not a silent override.
require_unique_keys()
# Each flag input declared once (no click warnings), and a local run ending with its summary, not its outputs' dump.
quiet_console()
# Registering with an inputs file that sweeps software sets: a train task per set on the set's image, so that
# registration builds each set's image (`tasks.software_images`).
SOFTWARE_SET_TRAIN_TASKS = define_set_train_tasks(inputs_file_argument(), train_condition)


# The map tasks are built in this node's pod: it needs the settings the train tasks were registered with, and the
# training image (the Elastic train tasks need torch to be defined).
@dynamic_node(container_image=training_image, environment=REGISTRATION_ENV)
def run_benchmark(
    planned: list[PlannedRun],
    execution: RunSettings,
    dataset_dir: FlyteDirectory,
    model_dir: FlyteDirectory,
    sources: SourceVersions | None = None,
) -> list[TrainOutput | None]:
    """Fan the training out over every planned run: one map task per GPU layout (nodes × GPUs per node, each its
    own train task) and software set (each on the set's image where registration built one:
    `tasks.software_images`), one after the other so that `execution.concurrency` holds over the whole grid; on
    `execution.accelerator` when one is named (else the train tasks' own)."""
    # Here, not at the top: the analysis image's pods import this module too (the frontier's dynamic node), and an
    # Elastic task cannot be defined without torch.
    from tasks.train_ranks import train_task

    mapped = []
    for (num_nodes, num_gpus, software_set), runs in runs_by_layout_and_set(planned).items():
        train = partial(
            train_task(num_nodes, num_gpus),
            dataset_dir=dataset_dir,
            model_dir=model_dir,
            sources=sources,
            condition_timeout_s=execution.condition_timeout_s,
            results_store=execution.results_store,
            force_fresh=execution.force_fresh,
        )
        outputs = map_task(train, concurrency=execution.concurrency, min_success_ratio=execution.min_success_ratio)(
            planned_run=runs
        )
        if execution.accelerator:
            outputs = outputs.with_overrides(accelerator=GPUAccelerator(accelerator_name(execution.accelerator)))
        if image := registered_image(software_set):  # a software set's runs on its own image
            outputs = outputs.with_overrides(container_image=image)
        if mapped:
            mapped[-1] >> outputs
        mapped.append(outputs)
    return mapped[0] if len(mapped) == 1 else concatenate_outputs(groups=mapped)


@workflow
def measure_grid(
    plan: BenchmarkPlan, training_args: TrainingArgs
) -> tuple[pd.DataFrame, pd.DataFrame, FlyteFile, FlyteDirectory]:
    """Download the model and data of `training_args`, train every planned run, analyse and report."""
    dataset_dir, model_dir, sources = download_sources(training_args, after=plan)
    planned = check_training_data(planned=plan.runs, dataset_dir=dataset_dir, model_dir=model_dir)
    outputs = run_benchmark(
        planned=planned, execution=plan.execution, dataset_dir=dataset_dir, model_dir=model_dir, sources=sources
    )
    results, steps, report, files, problems = analyze_results(
        planned=planned, outputs=outputs, execution=plan.execution, prediction=plan.prediction
    )
    # After the outputs are written: the execution fails when a measured run was not stored, logged or exported.
    require_nothing_lost(problems=problems)
    return results, steps, report, files


@workflow
def benchmarking_experiment(
    experiment_args: ExperimentArgs = smoke_experiment(),
    training_args: TrainingArgs = TrainingArgs(),
    n_runs: int = 1,
    concurrency: int = 4,
    min_success_ratio: float = 0.1,
    condition_timeout_s: int = 3600,
    results_store: str = "",
    force_fresh: bool = False,
    alpha: float = 0.05,
    dry_run: bool = False,
    skip_predicted_oom: bool = False,
    gpu_kind: str = "",
    gpu_memory_gib: float = 0.0,
    gpu_hour_price: float = 0.0,
    accelerator: str = "",
    fine_tune_epochs: float = 1.0,
    fine_tune_steps: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame, FlyteFile, FlyteDirectory]:
    """Returns the results table (one row per condition × run), the per-step table, the HTML report, and a
    directory holding the three as files (report.html, results and steps as Parquet and CSV).

    Finished runs are kept in `results_store` (a directory or an fsspec URL such as s3://bucket/prefix;
    empty: FINETUNE_BENCH_CACHE_DIR/results on the machine that trains) and reused by a re-run of the
    same grid; `force_fresh` measures every run again. `alpha`: the significance level of each arm's test against
    the baseline (and of each software set's against the reference set): refused where no test is run.

    Predictions (docs/prediction.md) are for `gpu_kind` (H100, H200, A100-80GB, ...; empty: the train task's
    accelerator), with `gpu_memory_gib` overriding its memory. `dry_run` downloads and trains nothing: the
    outputs are the plan (predicted peak memory, fits or not, step time per condition; GPU-hours and, with
    `gpu_hour_price`, their cost). `skip_predicted_oom` records a sure out-of-memory as a `predicted_oom` result
    without launching it.

    `accelerator`: the GPU the train tasks ask for on a cluster, a GPU kind (H100, H200, A100-80GB, ...) or a Flyte
    accelerator name (nvidia-h100, ...); empty: the one they were registered with (FINETUNE_BENCH_TRAIN_ACCELERATOR,
    default an A100). Also the GPU predicted for when `gpu_kind` is empty (else, FINETUNE_BENCH_TRAIN_ACCELERATOR when
    set).

    `fine_tune_epochs` / `fine_tune_steps`: the whole fine-tune you plan (its batch, padding or packing are the
    conditions'), projected from each measured run's steps and training rows; the Summary and the console lead with
    it (docs/report.md#your-fine-tune). `fine_tune_steps` > 0 wins over the epochs. Where planning knows the rows
    (generated data; packed, at most one row an example), a fine-tune that fills no optimizer step is refused, saying
    what would fill one.
    """
    plan = plan_benchmark(
        experiment_args=experiment_args,
        training_args=training_args,
        n_runs=n_runs,
        concurrency=concurrency,
        min_success_ratio=min_success_ratio,
        condition_timeout_s=condition_timeout_s,
        alpha=alpha,
        results_store=results_store,
        force_fresh=force_fresh,
        gpu_kind=gpu_kind,
        gpu_memory_gib=gpu_memory_gib,
        gpu_hour_price=gpu_hour_price,
        skip_predicted_oom=skip_predicted_oom,
        accelerator=accelerator,
        dry_run=dry_run,
        fine_tune_epochs=fine_tune_epochs,
        fine_tune_steps=fine_tune_steps,
    )
    results, steps, report, files = (
        conditional("dry_run")
        .if_(dry_run.is_true())
        .then(report_plan(plan=plan))
        .else_()
        .then(measure_grid(plan=plan, training_args=training_args))
    )
    return results, steps, report, files


# An inputs file is read as a whole before the CLI converts it input by input: every problem at once, the workflow's
# own settings checked as planning checks them.
read_inputs_whole(
    benchmarking_experiment, (check_n_runs, validate_run_settings, check_prediction_settings, check_fine_tune)
)
