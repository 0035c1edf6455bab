"""Result records → tables: one row per run, per-step data, and each arm against the baseline."""

import json
from pathlib import Path

import pandas as pd

from finetune_bench.inputs.arms import BASELINE
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import axis_names
from finetune_bench.measuring.metrics import ENERGY_UNAVAILABLE, GIB, METRICS
from finetune_bench.measuring.profiling import ATTENTION_KERNEL_DETAIL, PROFILE_FILE
from finetune_bench.prediction.gpus import capped_gpu
from finetune_bench.prediction.memory import MOMENT_PHASES
from finetune_bench.results.record import LOST, OK, RunResult

# The run-level metrics that have a results column (`measuring.metrics`: name, column, scale, unit, rank merge).
TABLE_METRICS = [metric for metric in METRICS.values() if metric.column is not None]
METRIC_COLUMNS = [metric.column for metric in TABLE_METRICS]
METRIC_BY_COLUMN = {metric.column: metric for metric in TABLE_METRICS}
# The cost column the analysis adds to the results table (`with_cost`), in the price's currency.
COST_COLUMN = "cost_per_million_tokens"
# The headline figures of each condition (`condition_summary`: their medians over ok runs).
SUMMARY_COLUMNS = (
    "tokens_per_second",
    "projected_tokens_per_second",
    "projected_fine_tune_s",
    "energy_per_token_j",
    COST_COLUMN,
    "step_time_median_s",
    "achieved_tflops",
    "mfu",
    "peak_allocated_gib",
    "peak_reserved_gib",
    "final_loss",
    "final_eval_loss",
)


# The results table's `hardware` of a run that trained on a CPU.
CPU = "cpu"


def hardware_label(device: str, gpu_name: str, memory_cap_gib: str = "") -> str:
    """What a run trained on, for the results table: "cpu", "gpu: <its name>" ("gpu: <its name> capped to <cap> GiB"
    where `gpu_memory_cap_gib` emulated a smaller GPU), "gpu", or "" when it did not say."""
    if str(device).startswith("cpu"):
        return CPU
    if gpu_name:
        return f"gpu: {capped_gpu(gpu_name, memory_cap_gib)}"
    return capped_gpu("gpu", memory_cap_gib) if device else ""


def run_hardware(result: RunResult) -> str:
    """What a run trained on (`hardware_label`), from its record."""
    env = result.environment
    return hardware_label(result.details.get("device", ""), env.get("gpu_name", ""), env.get("gpu_memory_cap_gib", ""))


def results_table(planned: list[PlannedRun], results: list[RunResult | None]) -> pd.DataFrame:
    """One row per planned run, in plan order. A run whose task was lost still gets its row."""
    by_key = {(r.condition_id, r.run_number): r for r in results if r is not None}
    rows = []
    for run in planned:
        result = by_key.get((run.condition_id, run.run_number))
        row: dict = {"condition_id": run.condition_id, "run_number": run.run_number}
        row.update({axis: getattr(run.training_args, axis) for axis in axis_names()})
        # what the run trained on: "cpu" (num_gpus, world_size and the per-GPU figures then count processes on the
        # CPU, not GPUs), or the GPU; empty when the run did not say
        row["hardware"] = ""
        # what it trained: the model and the data (the report's "What was measured" names them)
        row.update(model_name=run.training_args.model_name, dataset_name=run.training_args.dataset_name)
        row.update(world_size=run.training_args.world_size, global_batch_size=run.training_args.global_batch_size)
        # a GPU of another size, emulated (0: the whole GPU)
        row["gpu_memory_cap_gib"] = run.training_args.gpu_memory_cap_gib
        if result is None:
            row.update(status=LOST, reason="the training task failed; no result came back")
            rows.append(row)
            continue
        row["hardware"] = run_hardware(result)
        row.update(status=result.status, reason=result.reason)
        for metric in TABLE_METRICS:
            if metric.name in result.metrics:
                row[metric.column] = result.metrics[metric.name] / metric.scale
        if "tokens_per_second" in result.metrics and run.training_args.world_size == 1:
            row["tokens_per_second_per_gpu"] = result.metrics["tokens_per_second"]  # one GPU: all of it
        predicted = result.predicted_peak_reserved_bytes
        row["predicted_peak_reserved_gib"] = predicted / GIB if predicted is not None else float("nan")
        for moment, allocated in result.predicted_moment_allocated_bytes.items():
            row[f"predicted_{moment}_allocated_gib"] = allocated / GIB
        row.update(
            steps_completed=int(result.details.get("steps_completed", 0)),
            device=result.details.get("device", ""),
            dtype=result.details.get("dtype", ""),
            gpu_name=result.environment.get("gpu_name", ""),
            loss_path=result.loss_path,
            # the releases of the software set's pinned packages the run imported (JSON; empty: the installed set)
            imported_versions=result.details.get("imported_versions", ""),
            liger_patches=json.dumps(result.liger_patches, sort_keys=True) if result.liger_patches else "",
            wall_time_s=result.wall_time_s,
            # forked from the fork server (the imports done before the run) or a fresh interpreter
            child_started=result.details.get("child_started", ""),
            reused=result.reused,
            # when the run was measured (UTC; a reused run: by the execution that stored it)
            measured_at=result.details.get("measured_at", ""),
            problems="; ".join(result.problems),
            # the profile after the timed steps failed (the run's measurements stand)
            profile_error=result.details.get("profile_error", ""),
            # the scaled_dot_product_attention kernels the profile saw run (GPU runs with `profile` only)
            attention_kernel=result.details.get(ATTENTION_KERNEL_DETAIL, ""),
            # the held-out evaluations stopped early (out of memory); the run's training is measured
            eval_error=result.details.get("eval_error", ""),
            # why the run has no energy figures (a CPU, a GPU without NVML's energy counter, an NVML error)
            energy_unavailable=result.details.get(ENERGY_UNAVAILABLE, ""),
            # the slowest measured steps against their expected time, with their batch shapes (`steady_state`)
            slow_steps=result.details.get("outlier_steps", ""),
            # what torch.compile made of a compiled run (`running.backends.common.compile_details`): its graphs, its
            # graph breaks and their commonest reasons; NaN / empty where not compiled
            compile_graphs=_detail_number(result.details, "compile_graphs"),
            compile_graph_breaks=_detail_number(result.details, "compile_graph_breaks"),
            # (or why dynamo's counters could not be read)
            compile_graph_break_reasons=result.details.get(
                "compile_graph_break_reasons", result.details.get("compile_details_error", "")
            ),
            # float16 mixed precision (empty otherwise): the loss scale after the last training step, the steps
            # the scaler skipped for inf/NaN gradients, and the dtypes of the weights that trained and the frozen ones
            loss_scale=_detail_number(result.details, "loss_scale"),
            loss_scale_skipped_steps=_detail_number(result.details, "loss_scale_skipped_steps"),
            trainable_dtype=result.details.get("trainable_dtype", ""),
            # the model's parameters as the run counted them (LoRA's adapters included); NaN where it did not say
            num_parameters=_detail_number(result.details, "num_parameters"),
            frozen_dtype=result.details.get("frozen_dtype", ""),
            error_tail=result.error_tail,
        )
        rows.append(row)
    table = pd.DataFrame(rows)
    for column in [*METRIC_COLUMNS, "predicted_peak_reserved_gib"]:
        if column not in table:
            table[column] = float("nan")
    return table


def reuse_note(table: pd.DataFrame) -> str:
    """The Summary's word on runs taken from the results store instead of measured ("" when none was): how many,
    when and on what they were measured, and how to measure them again."""
    if table.empty or "reused" not in table or not table["reused"].fillna(False).astype(bool).any():
        return ""
    reused = table[table["reused"].fillna(False).astype(bool)]
    dates = sorted(d for d in reused.get("measured_at", pd.Series(dtype=str)).fillna("") if d)
    when = (f"on {dates[0]}" if dates[0] == dates[-1] else f"between {dates[0]} and {dates[-1]}") if dates else ""
    gpus = sorted({g for g in reused.get("gpu_name", pd.Series(dtype=str)).fillna("") if g}) or sorted(
        {d for d in reused.get("device", pd.Series(dtype=str)).fillna("") if d}
    )
    where = f"on {', '.join(gpus)}" if gpus else ""
    measured = " ".join(part for part in ("measured", when, where) if part != "")
    return (
        f"{len(reused)} of {len(table)} runs reused from the results store, {measured} by an earlier execution of the "
        "same settings, data, model and software (not measured now); force_fresh: true measures them again."
    )


def _detail_number(details: dict[str, str], key: str) -> float:
    """A run's numeric detail (details are kept as text), NaN where the run has none."""
    return float(details[key]) if details.get(key, "") != "" else float("nan")


def cost_per_million_tokens(tokens_per_second: float, gpus: float, gpu_hour_price: float) -> float:
    """What a million non-padding tokens cost at `tokens_per_second` over `gpus` GPUs, each at `gpu_hour_price` per
    hour: the price times the GPUs times the hours a million tokens take."""
    return gpu_hour_price * gpus * (1e6 / tokens_per_second) / 3600


def with_cost(table: pd.DataFrame, gpu_hour_price: float) -> pd.DataFrame:
    """`table` (one row per run) with `COST_COLUMN`: the cost of a million tokens at each run's measured throughput
    on its GPUs (the timed steps only: no warm-up, no evaluation, no start-up); NaN for every run when there is
    no price (0), and for a run without a throughput."""
    out = table.copy()
    if gpu_hour_price > 0 and not out.empty:
        gpus = out["world_size"] if "world_size" in out else 1
        throughput = out["tokens_per_second"].where(out["tokens_per_second"] > 0)
        out[COST_COLUMN] = cost_per_million_tokens(throughput, gpus, gpu_hour_price)
    else:
        out[COST_COLUMN] = float("nan")
    return out


RANK_COLUMNS = [
    "condition_id",
    "run_number",
    "rank",
    "node_rank",
    "local_rank",
    "host",
    "status",
    "reason",
    "tokens_per_second",
    "peak_allocated_gib",
    "peak_reserved_gib",
    "nvml_peak_gib",
]


def ranks_table(results: list[RunResult | None]) -> pd.DataFrame:
    """One row per rank of every run on several GPUs: where it ran, how it ended, its throughput and memory."""
    rows = []
    for result in results:
        for rank in result.ranks if result is not None else []:
            rows.append(
                {
                    "condition_id": result.condition_id,
                    "run_number": result.run_number,
                    **{name: getattr(rank, name) for name in RANK_COLUMNS[2:8]},
                    "tokens_per_second": rank.tokens_per_second,
                    **{
                        f"{name}_gib": getattr(rank, f"{name}_bytes") / GIB
                        if getattr(rank, f"{name}_bytes") is not None
                        else float("nan")
                        for name in ("peak_allocated", "peak_reserved", "nvml_peak")
                    },
                }
            )
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def prediction_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured peak reserved memory, for every ok run that has both (error: predicted over
    measured, minus 1)."""
    both = table[(table["status"] == OK) & table["predicted_peak_reserved_gib"].notna()]
    both = both[both["peak_reserved_gib"].notna()]
    columns = ["condition_id", "run_number", "predicted_peak_reserved_gib", "peak_reserved_gib"]
    errors = both[columns].copy()
    errors["error"] = errors["predicted_peak_reserved_gib"] / errors["peak_reserved_gib"] - 1
    return errors.reset_index(drop=True)


def phase_prediction_errors(table: pd.DataFrame) -> pd.DataFrame:
    """The memory model's allocated bytes at each moment it counts against the run's measured peak of the phases
    that moment is (`MOMENT_PHASES`: the backward pass's start against the forward pass, the loss and the backward
    pass; the optimizer step against its own), for every ok run that has both; with the moment the model puts the
    peak at and the phase the run's peak came from."""
    rows = []
    ok = table[table["status"] == OK] if "status" in table else table.iloc[0:0]
    for _, run in ok.iterrows():
        for moment, phases in MOMENT_PHASES.items():
            predicted = run.get(f"predicted_{moment}_allocated_gib")
            measured = [run.get(f"peak_allocated_{phase}_gib") for phase in phases]
            measured = [value for value in measured if value is not None and pd.notna(value)]
            if predicted is None or pd.isna(predicted) or not measured:
                continue
            rows.append(
                {
                    "condition_id": run["condition_id"],
                    "run_number": run["run_number"],
                    "moment": moment,
                    "phases": "+".join(phases),
                    "predicted_allocated_gib": predicted,
                    "measured_allocated_gib": max(measured),
                    "error": predicted / max(measured) - 1,
                }
            )
    columns = ["condition_id", "run_number", "moment", "phases", "predicted_allocated_gib", "measured_allocated_gib"]
    return pd.DataFrame(rows, columns=[*columns, "error"])


def _per_run(
    results: list[RunResult | None], files: dict[tuple[str, int], str], empty_columns: list[str]
) -> pd.DataFrame:
    """The rows of each run's CSV in `files` (by (condition_id, run_number)), each with the run's id, axis values
    and `hardware` (as the results table's); `empty_columns` when no run has rows."""
    frames = []
    for result in results:
        if result is None:
            continue
        path = files.get((result.condition_id, result.run_number))
        if not path or not Path(path).exists():
            continue
        frame = pd.read_csv(path)
        if frame.empty:
            continue
        frame.insert(0, "run_number", result.run_number)
        frame.insert(0, "condition_id", result.condition_id)
        for axis in axis_names():
            frame[axis] = getattr(result.training_args, axis)
        frame["hardware"] = run_hardware(result)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=empty_columns)
    return pd.concat(frames, ignore_index=True)


def steps_table(results: list[RunResult | None], steps_files: dict[tuple[str, int], str]) -> pd.DataFrame:
    """Every step of every run, with the run's id and axis values (warm-up steps flagged)."""
    return _per_run(results, steps_files, ["condition_id", "run_number", "step"])


def condition_summary(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per condition: runs, how they ended, the median of each headline metric over ok runs, and the
    run-to-run spread of throughput ((max − min) / median over ok runs; 0 with a single run)."""
    keys = swept or ["condition_id"]
    ok = table[table["status"] == OK]
    medians = ok.groupby(keys, dropna=False)[[column for column in SUMMARY_COLUMNS if column in table]].median()
    counts = table.groupby(keys, dropna=False).agg(
        runs=("run_number", "size"),
        ok_runs=("status", lambda s: int((s == OK).sum())),
        statuses=("status", lambda s: ", ".join(f"{k}×{v}" for k, v in s.value_counts().items())),
    )
    throughput = ok.groupby(keys, dropna=False)["tokens_per_second"]
    spread = ((throughput.max() - throughput.min()) / throughput.median()).rename("tokens_per_second_spread")
    return counts.join(medians).join(spread).reset_index()


def arms_vs_baseline(summary: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """For each arm but the baseline, at each point of the other axes: its median throughput, peak memory and
    energy per token over the baseline's, and both costs per million tokens (NaN where unknown)."""
    if "arm" not in swept:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    keys = others or ["_all"]
    keyed = summary.assign(_all="all")
    for column in ("energy_per_token_j", COST_COLUMN):  # a summary of a table without them: unknown
        if column not in keyed:
            keyed[column] = float("nan")
    figures = ["statuses", "tokens_per_second", "peak_reserved_gib", "energy_per_token_j", COST_COLUMN]
    base = keyed[keyed["arm"] == BASELINE][[*keys, *figures]]
    treated = keyed[keyed["arm"] != BASELINE][["arm", *keys, *figures]]
    out = treated.merge(base, on=keys, suffixes=("", "_baseline"))
    out = pd.DataFrame(
        {
            **{key: out[key] for key in keys},
            "arm": out["arm"],
            "arm_runs": out["statuses"],
            "baseline_runs": out["statuses_baseline"],
            "arm_tokens_per_second": out["tokens_per_second"],
            "baseline_tokens_per_second": out["tokens_per_second_baseline"],
            "throughput_ratio": out["tokens_per_second"] / out["tokens_per_second_baseline"],
            "arm_peak_reserved_gib": out["peak_reserved_gib"],
            "baseline_peak_reserved_gib": out["peak_reserved_gib_baseline"],
            "peak_reserved_ratio": out["peak_reserved_gib"] / out["peak_reserved_gib_baseline"],
            "arm_energy_per_token_j": out["energy_per_token_j"],
            "baseline_energy_per_token_j": out["energy_per_token_j_baseline"],
            "energy_per_token_ratio": out["energy_per_token_j"] / out["energy_per_token_j_baseline"],
            f"arm_{COST_COLUMN}": out[COST_COLUMN],
            f"baseline_{COST_COLUMN}": out[f"{COST_COLUMN}_baseline"],
        }
    )
    return out.drop(columns="_all") if not others else out


def ran_on_cpu(table: pd.DataFrame) -> bool:
    """Whether any run of the results table trained on a CPU (its timings then say nothing about speed)."""
    return bool((table.get("device", pd.Series(dtype=str)).astype(str).str.startswith("cpu")).any())


def profile_table(results: list[RunResult | None], profile_dirs: dict[tuple[str, int], str]) -> pd.DataFrame:
    """Every profiled run's per-kernel rows (name, category, time and calls per step, share), with the run's id
    and axis values."""
    files = {key: str(Path(directory) / PROFILE_FILE) for key, directory in profile_dirs.items()}
    return _per_run(results, files, ["condition_id", "run_number", "name", "category", "time_ms_per_step"])


def profile_categories(profile: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per condition (the swept axes) and category: the profiled time per step (ms), the median over the
    condition's profiled runs."""
    if profile.empty:
        return pd.DataFrame()
    keys = [axis for axis in swept if axis in profile] or ["condition_id"]
    per_run = profile.groupby([*keys, "run_number", "category"], dropna=False)["time_ms_per_step"].sum().reset_index()
    return per_run.groupby([*keys, "category"], dropna=False)["time_ms_per_step"].median().reset_index()
