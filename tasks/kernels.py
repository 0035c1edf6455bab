"""Kernel-benchmark tasks: check the sweep, run one kernel's sweep (in a child process), report them all."""

import tempfile
from pathlib import Path
from typing import NamedTuple

import click
import pandas as pd
from flytekit import current_context, task
from flytekit.types.file import FlyteFile

from finetune_bench.kernels.report import build_kernel_report, comparison, nothing_measured
from finetune_bench.kernels.settings import (
    KernelBenchmarkSettings,
    check_device_here,
    check_settings_act,
    check_software_sets_install,
    kernels_not_benchmarked,
    kernels_to_run,
)
from images import analysis_image, training_image
from tasks.analysis import publish
from tasks.inputs_yaml import inputs_file_argument
from tasks.plan import check_export_location, checked, for_a_cluster
from tasks.registration import ANALYSIS_RESOURCES, REGISTRATION_ENV, TRAIN_ACCELERATOR, TRAIN_RESOURCES


class KernelPlan(NamedTuple):
    kernels: list[str]
    # What the installed liger-kernel ships that this benchmark has no case for (the report lists them).
    not_benchmarked: list[str]


def local_gpu_names() -> list[str]:
    """This machine's GPUs (NVML; none without a driver)."""
    from finetune_bench.measuring.gpu import gpu_names

    return gpu_names()


# The training image: liger-kernel is installed there, and its list of kernels is read from it.
@task(container_image=training_image, requests=ANALYSIS_RESOURCES, environment=REGISTRATION_ENV)
def plan_kernels(sweep: KernelBenchmarkSettings) -> KernelPlan:
    """The kernels to run, and those Liger ships that have no case here; every problem of the sweep at once,
    before any GPU time is spent: among them a setting that acts in nothing the sweep runs here (the time budgets of
    device auto on a machine without a GPU, `check_settings_act`; a cluster's pods have one)."""
    return KernelPlan(
        checked(
            lambda: kernels_to_run(sweep),
            sweep.check,
            check_export_location,
            lambda: check_software_sets_install(sweep),
            lambda: None if for_a_cluster() else check_device_here(sweep, local_gpu_names()),
            lambda: check_settings_act(sweep, for_a_cluster() or bool(local_gpu_names())),
        ),
        kernels_not_benchmarked(),
    )


@task(
    container_image=training_image,
    requests=TRAIN_RESOURCES,
    accelerator=TRAIN_ACCELERATOR,
    environment=REGISTRATION_ENV,
)
def benchmark_kernel(sweep: KernelBenchmarkSettings, kernel: str) -> FlyteFile:
    """Every point of one kernel's sweep, measured in a child process of its own; its rows as a CSV."""
    from finetune_bench.kernels.run import run_kernel_in_child

    work_dir = Path(tempfile.mkdtemp(prefix=f"kernel-{kernel}-", dir=current_context().working_directory))
    rows = run_kernel_in_child(sweep, kernel, work_dir)
    path = work_dir / f"{kernel}.csv"
    rows.to_csv(path, index=False)
    return FlyteFile(str(path))


class KernelOutputs(NamedTuple):
    rows: pd.DataFrame
    comparison: pd.DataFrame
    report: FlyteFile


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def report_kernels(sweep: KernelBenchmarkSettings, rows: list[FlyteFile], not_benchmarked: list[str]) -> KernelOutputs:
    """Every row (Liger's benchmark-data columns plus status and reason), the provider-by-provider comparison,
    and the HTML report (also the Deck), written with the tables to the export directory when one is set."""
    table = pd.concat([pd.read_csv(file.download()) for file in rows], ignore_index=True)
    compared = comparison(table)
    published = None
    if sweep.compare_with:
        published = pd.read_csv(sweep.compare_with)
    report = build_kernel_report(table, sweep.model, not_benchmarked, published, sweep, inputs_file_argument())
    report_file, _, problems = publish(
        report,
        "kernel_report.html",
        {"kernel_rows": table, "kernel_comparison": compared},
        {},
        title="Kernel benchmark",
    )
    if problems:  # measured, and not exported as asked: the run says so in its exit status
        raise click.ClickException("; ".join(problems))
    failed = nothing_measured(table)
    if failed:  # the report says what failed; the run says so in its exit status
        raise click.ClickException(failed)
    return KernelOutputs(table, compared, report_file)
