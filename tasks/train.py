"""Planning the runs, and training one run in a child process."""

import tempfile
from pathlib import Path

from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.launch import run_in_child
from finetune_bench.plan import PlannedRun, plan_runs
from finetune_bench.spec import ExperimentArgs, TrainingArgs
from images import analysis_image, training_image
from tasks.records import TrainOutput
from tasks.settings import ANALYSIS_RESOURCES, TRAIN_ACCELERATOR, TRAIN_RESOURCES


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES)
def plan_benchmark(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> list[PlannedRun]:
    """Validate the inputs (before anything is downloaded or trained) and list every run."""
    return plan_runs(experiment_args, training_args, n_runs)


@task(container_image=training_image, requests=TRAIN_RESOURCES, accelerator=TRAIN_ACCELERATOR)
def train_condition(
    planned_run: PlannedRun,
    dataset_dir: FlyteDirectory,
    model_dir: FlyteDirectory,
    condition_timeout_s: int,
) -> TrainOutput:
    """Train one run in a fresh child process; its failure (OOM, crash, timeout) is its result."""
    # Unique per run: locally, every item of a map task shares one working directory.
    work_dir = Path(tempfile.mkdtemp(prefix="run-", dir=current_context().working_directory))
    result = run_in_child(
        planned_run,
        dataset_dir=Path(dataset_dir.download()),
        model_dir=Path(model_dir.download()),
        work_dir=work_dir,
        timeout_s=condition_timeout_s,
    )
    return TrainOutput(result=result, steps=FlyteFile(result.steps_file) if result.steps_file else None)
