"""The memory-frontier workflow: per arm, the largest batch size and the largest sequence length that train
without running out of memory, then (optionally) throughput at those frontiers.

pyflyte run workflows/frontier.py memory_frontier --inputs-file inputs/frontier_smoke.yaml
union run --remote workflows/frontier.py memory_frontier --inputs-file inputs/frontier_llama1b_2048.yaml
"""

from functools import partial

from flytekit import conditional, map_task, workflow
from flytekit.types.directory import FlyteDirectory

from finetune_bench.frontier.planning import check_throughput_settings
from finetune_bench.frontier.predicted import check_frontier_prediction
from finetune_bench.frontier.search import FrontierResult
from finetune_bench.frontier.settings import (
    BatchSizeSearch,
    FrontierArm,
    FrontierSearch,
    ProbeSettings,
    SeqLengthSearch,
)
from finetune_bench.inputs.plan import RunSettings
from finetune_bench.inputs.reading import check_n_runs
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.inputs.validation import validate_run_settings
from images import training_image
from tasks.analysis import require_nothing_lost
from tasks.data import download_sources
from tasks.dynamic import dynamic_node
from tasks.frontier import (
    FrontierOutputs,
    FrontierPlan,
    plan_frontier,
    plan_frontier_throughput,
    report_frontier,
    report_frontier_plan,
)
from tasks.inputs_yaml import read_inputs_whole, require_unique_keys
from tasks.registration import REGISTRATION_ENV
from workflows.benchmark import run_benchmark
from workflows.console import quiet_console

# Before the CLI reads --inputs-file: a key given twice is an error, not a silent override.
require_unique_keys()
# Each flag input declared once (no click warnings), and a local run ending with its summary, not its outputs' dump.
quiet_console()


# The training image: the search tasks on several GPUs are Elastic tasks, which cannot be defined without torch.
@dynamic_node(container_image=training_image, environment=REGISTRATION_ENV)
def run_searches(
    searches: list[FrontierSearch], execution: RunSettings, dataset_dir: FlyteDirectory, model_dir: FlyteDirectory
) -> list[FrontierResult | None]:
    """One task per (arm, dimension): its probes decide one after another, the searches run side by side (at most
    `execution.concurrency` at once). Every search trains on the layout its settings name (`num_nodes` × `num_gpus`,
    the same for all: arms differ in their arm alone): one GPU's search task, or the Elastic task of that layout,
    whose every probe trains on all its ranks (`tasks.frontier_ranks`)."""
    from tasks.frontier_ranks import search_task

    layouts = {(s.training_args.num_nodes, s.training_args.num_gpus) for s in searches}
    if len(layouts) != 1:
        raise ValueError(f"the searches of one frontier train on one layout (nodes, GPUs), not {sorted(layouts)}")
    ((num_nodes, num_gpus),) = layouts
    search = partial(search_task(num_nodes, num_gpus), dataset_dir=dataset_dir, model_dir=model_dir)
    mapped = map_task(search, concurrency=execution.concurrency, min_success_ratio=execution.min_success_ratio)
    return mapped(search=searches)


# The embedded default is inputs/frontier_smoke.yaml: an offline CPU run (give it a fake memory limit,
# FINETUNE_BENCH_FAKE_MEMORY_TOKENS, for frontiers below the caps).
SMOKE_TRAINING_ARGS = TrainingArgs(
    backend="plain_loop", synthetic_num_examples=64, synthetic_min_words=64, synthetic_max_words=80
)


@workflow
def measure_frontiers(
    plan: FrontierPlan,
    training_args: TrainingArgs,
    arms: list[FrontierArm] | None,
    measure_throughput: bool,
    n_runs: int,
    claim: str = "",
) -> FrontierOutputs:
    """Download the model and data, run the searches, then (optionally) the throughput runs, and report."""
    # Each use reads the plan's attribute anew: flytekit's local run resolves an attribute promise in place, so one
    # read twice would be resolved twice.
    dataset_dir, model_dir, sources = download_sources(training_args, after=plan)
    results = run_searches(
        searches=plan.searches, execution=plan.execution, dataset_dir=dataset_dir, model_dir=model_dir
    )
    throughput = plan_frontier_throughput(
        results=results,
        training_args=training_args,
        arms=arms,
        n_runs=n_runs,
        measure_throughput=measure_throughput,
        execution=plan.execution,
    )
    outputs = run_benchmark(
        planned=throughput.runs,
        execution=throughput.execution,
        dataset_dir=dataset_dir,
        model_dir=model_dir,
        sources=sources,
    )
    frontiers, probe_table, throughput_table, report, problems = report_frontier(
        searches=plan.searches,
        results=results,
        planned=throughput.runs,
        outputs=outputs,
        execution=throughput.execution,
        claim=claim,
    )
    # After the outputs are written: the execution fails when a measured run was not stored, logged or exported.
    require_nothing_lost(problems=problems)
    return frontiers, probe_table, throughput_table, report


@workflow
def memory_frontier(
    training_args: TrainingArgs = SMOKE_TRAINING_ARGS,
    # None: liger and baseline (finetune_bench.frontier.settings.DEFAULT_ARMS). Not a list of dataclasses as a
    # default: pyflyte cannot convert one into a command-line default.
    arms: list[FrontierArm] | None = None,
    batch_size_search: BatchSizeSearch = BatchSizeSearch(start=1, cap=4),
    seq_length_search: SeqLengthSearch = SeqLengthSearch(batch_size=1, start=32, cap=64, granularity=32),
    probes: ProbeSettings = ProbeSettings(
        max_steps=2, timing_warmup_steps=1, retries=1, confirmations=1, timeout_s=600
    ),
    measure_throughput: bool = False,
    n_runs: int = 1,
    concurrency: int = 4,
    min_success_ratio: float = 0.1,
    condition_timeout_s: int = 3600,
    results_store: str = "",
    force_fresh: bool = False,
    dry_run: bool = False,
    gpu_kind: str = "",
    gpu_memory_gib: float = 0.0,
    claim: str = "",
) -> FrontierOutputs:
    """Returns the frontier table (one row per arm × dimension), every probe, the throughput runs at the
    frontiers (empty unless measure_throughput) and the HTML report.

    Probes always run afresh. The throughput runs go through the benchmark's train task, which keeps
    finished runs in `results_store` and reuses them unless `force_fresh` (see workflows/benchmark.py).
    `dry_run`: nothing is downloaded or probed; the outputs are each search's predicted frontier on `gpu_kind`
    (empty: the train task's accelerator; `gpu_memory_gib` overrides its memory), see docs/prediction.md.
    `claim`: a published claim the report sets beside what was measured (`finetune_bench.frontier.claims.CLAIMS`,
    e.g. liger-readme-context-length; empty: none).
    """
    plan = plan_frontier(
        training_args=training_args,
        arms=arms,
        batch_size_search=batch_size_search,
        seq_length_search=seq_length_search,
        probes=probes,
        n_runs=n_runs,
        concurrency=concurrency,
        min_success_ratio=min_success_ratio,
        condition_timeout_s=condition_timeout_s,
        results_store=results_store,
        force_fresh=force_fresh,
        gpu_kind=gpu_kind,
        gpu_memory_gib=gpu_memory_gib,
        measure_throughput=measure_throughput,
        dry_run=dry_run,
        claim=claim,
    )
    frontiers, probe_table, throughput, report = (
        conditional("dry_run")
        .if_(dry_run.is_true())
        .then(report_frontier_plan(searches=plan.searches, gpu_kind=gpu_kind, gpu_memory_gib=gpu_memory_gib))
        .else_()
        .then(
            measure_frontiers(
                plan=plan,
                training_args=training_args,
                arms=arms,
                measure_throughput=measure_throughput,
                n_runs=n_runs,
                claim=claim,
            )
        )
    )
    return frontiers, probe_table, throughput, report


# An inputs file is read as a whole before the CLI converts it input by input: every problem at once, the workflow's
# own settings checked as planning checks them.
read_inputs_whole(
    memory_frontier, (check_n_runs, validate_run_settings, check_frontier_prediction, check_throughput_settings)
)
