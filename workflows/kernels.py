"""The kernel benchmark: each Liger kernel against its reference (and torch.compile of it), forward, backward and
full pass, speed and peak memory, over token counts at a model's shapes; one kernel per child process.

pyflyte run workflows/kernels.py kernel_benchmark --inputs-file inputs/kernels_smoke.yaml
union run --remote workflows/kernels.py kernel_benchmark --inputs-file inputs/kernels_llama3_8b.yaml
"""

from functools import partial

from flytekit import map_task, workflow
from flytekit.types.file import FlyteFile

from finetune_bench.kernels.settings import KernelBenchmarkSettings
from images import analysis_image
from tasks.dynamic import dynamic_node
from tasks.inputs_yaml import read_inputs_whole, require_unique_keys
from tasks.kernels import KernelOutputs, benchmark_kernel, plan_kernels, report_kernels
from tasks.registration import REGISTRATION_ENV
from workflows.console import quiet_console

# Before the CLI reads --inputs-file: a key given twice is an error, not a silent override.
require_unique_keys()
# Each flag input declared once (no click warnings), and a local run ending with its summary, not its outputs' dump.
quiet_console()


@dynamic_node(container_image=analysis_image, environment=REGISTRATION_ENV)
def run_kernels(sweep: KernelBenchmarkSettings, kernels: list[str]) -> list[FlyteFile]:
    """One task per kernel, one at a time (they share the GPU; what they measure must not overlap)."""
    return map_task(partial(benchmark_kernel, sweep=sweep), concurrency=1)(kernel=kernels)


# The embedded default is inputs/kernels_smoke.yaml: an offline CPU check at tiny shapes (timings meaningless).
SMOKE_SWEEP = KernelBenchmarkSettings(
    kernels=["rms_norm", "swiglu", "fused_linear_cross_entropy"], model="tiny-llama", tokens=[16, 32], device="cpu"
)


@workflow
def kernel_benchmark(sweep: KernelBenchmarkSettings = SMOKE_SWEEP) -> KernelOutputs:
    """Returns every measured row (Liger's benchmark-data columns, plus status and reason), Liger against the
    reference per kernel, mode, metric and size, and the HTML report."""
    kernels, not_benchmarked = plan_kernels(sweep=sweep)
    rows = run_kernels(sweep=sweep, kernels=kernels)
    return report_kernels(sweep=sweep, rows=rows, not_benchmarked=not_benchmarked)


# An inputs file is read as a whole before the CLI converts it: its unknown inputs and the sweep's problems at once.
read_inputs_whole(kernel_benchmark)
