"""The dry run's report: the planned grid with its predictions, nothing downloaded or trained."""

import click
import pandas as pd
from flytekit import task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.prediction.grid import estimate_grid, target_gpu
from finetune_bench.reporting.plan_report import plan_report, plan_table, plan_text
from images import training_image
from tasks.analysis import publish
from tasks.settings import ANALYSIS_RESOURCES, REGISTRATION_ENV


# The training image: the memory model reads Liger's table (which kernels an arm patches) from the installed
# liger-kernel, which the analysis image leaves out.
@task(container_image=training_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def report_plan(
    planned: list[PlannedRun],
    gpu_kind: str,
    gpu_memory_gib: float,
    gpu_hour_price: float,
    skip_predicted_oom: bool,
    accelerator: str = "",
) -> tuple[pd.DataFrame, pd.DataFrame, FlyteFile, FlyteDirectory]:
    """The plan as the workflow's outputs: the plan table (one row per condition) in place of the results, no
    steps, the plan report (plan.html, also the Deck) and a directory with plan.html and plan.csv / .parquet."""
    target = target_gpu(gpu_kind, gpu_memory_gib, accelerator)
    estimate = estimate_grid(planned, target, gpu_hour_price, skip_predicted_oom)
    print(plan_text(estimate), flush=True)
    table = plan_table(estimate)
    report_file, files, problems = publish(plan_report(estimate), "plan.html", {"plan": table}, {}, title="Plan")
    if problems:  # the plan was asked to be exported and was not: the run says so in its exit status
        raise click.ClickException("; ".join(problems))
    return table, pd.DataFrame(), report_file, files
