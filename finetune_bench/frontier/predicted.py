"""The frontier workflow's dry run: where the memory model puts each search's frontier on the target GPU, as a
table, as the lines a console prints and as the plan's report; and, at planning, the GPU the searches' first probes
are checked against."""

import dataclasses
import html

import pandas as pd

from finetune_bench.analysis.numbers import number_text
from finetune_bench.frontier.guide import memory_guide
from finetune_bench.frontier.search import Guide, ProbeOutcome, largest_predicted_fit, search_frontier
from finetune_bench.frontier.settings import SEARCH_SECTIONS, FrontierSearch, arm_name
from finetune_bench.inputs.errors import Problems
from finetune_bench.inputs.plan import PredictionTarget, Workload, check_workflow_settings_act
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.gpu import gpu_memory_bytes, gpu_names
from finetune_bench.prediction.gpus import GIB, caps_text, describe_gpu, emulated_memory_bytes, usable_bytes
from finetune_bench.prediction.grid import (
    MARGIN,
    OOM,
    RUN_OVERHEAD_S,
    Target,
    check_plan_settings,
    predict_condition,
    sequences_full,
    shape_of,
    target_gpu,
)
from finetune_bench.prediction.memory import predict_memory
from finetune_bench.prediction.shapes import model_config, model_shape
from finetune_bench.reporting.benchmark_tabs.measured import measured_html
from finetune_bench.reporting.html import Report, table_html
from finetune_bench.results.record import OK
from finetune_bench.results.record import OOM as OOM_STATUS


def predicted_probes(search: FrontierSearch, guide: Guide) -> int:
    """The probes `search` takes were the memory model `guide` right: the search itself (`search_frontier`: guided
    where `search.guided`, else doubling; its confirmations included) run against probes that fit where the model's
    peak reserved memory stays within the guide's limit, and measure the model's peaks. A probe that fails otherwise
    and is retried is not foreseen."""

    def probe(args: TrainingArgs) -> ProbeOutcome:
        value = getattr(args, search.dimension)
        reserved = guide.predict(value)
        if reserved > guide.limit_bytes:
            return ProbeOutcome(status=OOM_STATUS)
        allocated = guide.predict_allocated(value) if guide.predict_allocated is not None else None
        return ProbeOutcome(status=OK, peak_reserved_bytes=reserved, peak_allocated_bytes=allocated)

    return search_frontier(search, probe, guide if search.guided else None).probes_used


def predicted_frontiers(searches: list[FrontierSearch], target: Target) -> pd.DataFrame:
    """One row per search: the predicted frontier on `target` (the largest size whose predicted peak reserved
    memory stays within what torch can reserve), that peak, the probes the search would take were the model right
    (`predicted_probes`: guided or doubling as `probes.guided` says, with `probes.confirmations`) and their GPU time
    (each probe's start-up, on every GPU it holds)."""
    rows = []
    for search in searches:
        row = {"arm": arm_name(search.arm), "dimension": search.dimension, "start": search.start, "cap": search.cap}
        row["gpu_memory_cap_gib"] = search.training_args.gpu_memory_cap_gib
        # the model's frontier, whether or not the search will be guided by it
        guide, why = memory_guide(dataclasses.replace(search, guided=True), target.memory_bytes)
        if guide is None:
            rows.append({**row, "predicted_frontier": None, "not_predicted": why})
            continue
        frontier = largest_predicted_fit(search, guide)
        if guide.predict(search.start) > guide.limit_bytes:
            row["verdict"] = "nothing fits: even the start value is predicted out of memory"
        elif frontier == search.cap:
            row["verdict"] = "the cap fits: the frontier may lie higher"
        else:
            row["verdict"] = "found"
        args = dataclasses.replace(search.training_args, **{search.dimension: frontier})
        peak = predict_memory(
            args,
            model_shape(model_config(args.model_name, overrides=args.model_config_overrides)),
            sequences_full(args),
        )
        row.update(predicted_frontier=frontier, predicted_peak_reserved_gib=peak.peak_reserved_bytes / GIB)
        row["usable_gib"] = guide.limit_bytes / GIB
        row["search"] = "guided" if search.guided else "doubling"
        row["predicted_probes"] = predicted_probes(search, guide)
        # every GPU of a probe (a search on several GPUs holds them all)
        row["predicted_gpu_seconds"] = row["predicted_probes"] * RUN_OVERHEAD_S * search.training_args.world_size
        rows.append(row)
    return pd.DataFrame(rows)


def check_first_probes(searches: list[FrontierSearch], target: Target) -> None:
    """Refuse a search whose first probe the memory model puts out of memory on `target` even if the model is
    `prediction.grid.MARGIN` high (a sure OOM, as a benchmark plan's `oom` verdict): its every probe could only run
    out of memory. Every such search at once; a search the model does not cover, or no GPU memory known, passes."""
    problems = Problems()
    shapes: dict[tuple[str, str], object] = {}
    for search in searches:
        args = dataclasses.replace(search.training_args, **{search.dimension: search.start})
        model = (args.model_name, args.model_config_overrides)
        if model not in shapes:
            shapes[model] = shape_of(args)[0]
        if shapes[model] is None:
            continue
        predicted = predict_condition("", args, target, shapes[model])
        if predicted.verdict != OOM:
            continue
        section = SEARCH_SECTIONS[search.dimension]
        memory = emulated_memory_bytes(args, target.memory_bytes)
        gpu = describe_gpu(target.name or "the GPU", args)
        problems.found.append(
            f"{section}.start {search.start} (arm {arm_name(search.arm)}): the memory model predicts "
            f"{predicted.memory.peak_reserved_bytes / GIB:.1f} GiB there, above the "
            f"{usable_bytes(memory) / GIB:.1f} GiB usable on {gpu} even if it is {MARGIN * 100:.0f} % high, so "
            f"every probe would run out of memory; lower {section}.start"
        )
    problems.raise_if_any()


def probe_target(gpu_kind: str, gpu_memory_gib: float, accelerator: str, on_this_machine: bool) -> Target:
    """The GPU the probes will run on, as planning knows it: where they run `on_this_machine` (a local run, not a dry
    run), its own GPU where one is visible; else the target of `gpu_kind` or `accelerator` (the dry run's target or,
    on a cluster, the train tasks' accelerator)."""
    if on_this_machine:
        memory = gpu_memory_bytes()
        if memory:
            return Target(name=gpu_names()[0], memory_bytes=memory, peak_tflops=None, assumed_mfu=None)
    return target_gpu(gpu_kind, gpu_memory_gib, accelerator)


def check_prediction_acts(gpu_kind: str, gpu_memory_gib: float, training_args: TrainingArgs, gpu_here: bool) -> None:
    """The GPU a frontier predicts for (its dry run's target, the GPU its first probes are checked against) acts as
    the benchmark's does, where its scope says (`inputs.plan.PredictionTarget`): refused where the probes train on a
    CPU (device cpu), where nothing is predicted. `gpu_here`: whether device auto finds a GPU."""
    target = PredictionTarget(gpu_kind=gpu_kind, gpu_memory_gib=gpu_memory_gib)
    check_workflow_settings_act([target], Workload.of([training_args], gpu_here))


def check_frontier_prediction(gpu_kind: str, gpu_memory_gib: float) -> None:
    """The GPU a dry run predicts for (no price: the frontier has none)."""
    check_plan_settings(gpu_kind, gpu_memory_gib, 0.0)


# The verdicts of `predicted_frontiers`, as the totals count them (a verdict's words before its colon).
FOUND = "found"
NOT_PREDICTED = "not predicted"
# The plan table's sizes in GiB, written with the digits that carry them (a tiny model's 0.0022, not 0.0).
GIB_COLUMNS = ("predicted_peak_reserved_gib", "usable_gib")


def gib_text(value: float) -> str:
    """A size in GiB with one decimal, or two significant digits below 1 GiB; "–" where it is missing."""
    return number_text(value, min_decimals=1)


def _verdict(row: dict) -> str:
    verdict = row.get("verdict")
    return verdict if isinstance(verdict, str) and verdict else NOT_PREDICTED


def plan_lines(table: pd.DataFrame) -> list[str]:
    """One line per search of `predicted_frontiers`' table: what it searches, where the frontier is predicted and
    the peak there, or why it is not predicted."""
    lines = []
    for row in table.to_dict("records"):
        head = f"{row['arm']}, {row['dimension']} {row['start']} to {row['cap']}"
        verdict = _verdict(row)
        if verdict == NOT_PREDICTED:
            lines.append(f"{head}: not predicted ({row.get('not_predicted') or 'no prediction'})")
            continue
        peak = f"{gib_text(row['predicted_peak_reserved_gib'])} GiB"
        if verdict == FOUND:
            lines.append(f"{head}: predicted frontier {int(row['predicted_frontier'])}, peak {peak}")
        elif verdict.startswith("nothing fits"):
            lines.append(f"{head}: {verdict} (peak {peak} at {row['start']})")
        else:
            lines.append(f"{head}: predicted frontier {int(row['predicted_frontier'])}, peak {peak}; {verdict}")
    return lines


def plan_totals(table: pd.DataFrame, target: Target) -> list[str]:
    """The plan's totals: the target GPU and what torch can reserve of it, the searches by verdict, and the GPU time
    of their probes (the plan report's headline: a dry run's console ends with them)."""
    usable = table["usable_gib"].dropna() if "usable_gib" in table else pd.Series(dtype=float)
    lines = [
        f"target GPU: {target.describe()}"
        + (f", {gib_text(usable.iloc[0])} GiB usable by torch" if len(usable) else "")
        + caps_text(table.get("gpu_memory_cap_gib", pd.Series(dtype=float)))
    ]
    verdicts = pd.Series([_verdict(row).split(":")[0] for row in table.to_dict("records")], dtype=object)
    counts = ", ".join(f"{n} {verdict}" for verdict, n in verdicts.value_counts(sort=False).items())
    lines.append(f"searches: {len(table)}" + (f" ({counts})" if counts else ""))
    seconds = table["predicted_gpu_seconds"].sum() if "predicted_gpu_seconds" in table else 0
    if seconds:
        probes = int(table["predicted_probes"].sum())
        lines.append(
            f"GPU time: about {seconds:,.0f} GPU-seconds ({probes} probes were the memory model right, "
            f"{RUN_OVERHEAD_S:.0f} s start-up each)"
        )
    return lines


def frontier_plan_report(table: pd.DataFrame, target: Target, header: dict[str, str]) -> Report:
    """The dry run's report: what would be measured (`header`), the totals, and each search's predicted frontier
    (sizes in GiB with the digits that carry them); its headline, the totals."""
    totals = plan_totals(table, target)
    shown = table.assign(**{c: table[c].map(gib_text) for c in GIB_COLUMNS if c in table})
    intro = measured_html(header, "What would be measured") + (
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in totals) + "</ul>"
        f"<p>A dry run on {html.escape(target.describe())}: nothing was downloaded or probed. The predicted frontier "
        "is the largest size whose predicted peak reserved memory stays within what torch can reserve "
        "(docs/prediction.md). <code>predicted_probes</code>: the probes each search would take were the model "
        "right (a guided search starts just below the predicted frontier, a doubling one at its start; both re-probe "
        "the frontier <code>probes.confirmations</code> times); a probe retried after a failure is not foreseen.</p>"
    )
    return Report(sections={"Plan": intro + table_html(shown)}, headline=totals)
