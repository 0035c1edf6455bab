"""How a run's throughput scales with GPUs: each multi-GPU condition against the same settings on one GPU."""

import pandas as pd

from finetune_bench.results.record import OK

# The axes that say how many GPUs train a condition and how they share it; every other axis names the workload.
LAYOUT_AXES = ("num_gpus", "num_nodes", "parallelism")
SCALING_COLUMNS = [
    "world_size",
    "runs",
    "tokens_per_second",
    "tokens_per_second_per_gpu",
    "one_gpu_tokens_per_second",
    "ideal_tokens_per_second",
    "scaling_efficiency",
    "peak_reserved_gib",
    "peak_reserved_spread_gib",
]


def scaling_table(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per condition (its ok runs' means): global and per-GPU tokens/s, and its scaling efficiency, the tokens/s
    over `world_size` × the tokens/s of the same settings (every swept axis but the layout's) on one GPU, when the
    grid has that condition; with the largest rank's peak reserved memory and its spread over the ranks. Empty
    when the grid has no condition on several GPUs."""
    if table.empty or "world_size" not in table or not (table["world_size"] > 1).any():
        return pd.DataFrame(columns=[*swept, *SCALING_COLUMNS])
    workload = [axis for axis in swept if axis not in LAYOUT_AXES]
    ok = table[table["status"] == OK]
    by_condition = (
        ok.groupby(["condition_id"], sort=False)
        .agg(
            world_size=("world_size", "first"),
            runs=("run_number", "count"),
            tokens_per_second=("tokens_per_second", "mean"),
            tokens_per_second_per_gpu=("tokens_per_second_per_gpu", "mean"),
            peak_reserved_gib=("peak_reserved_gib", "mean"),
            peak_reserved_spread_gib=("peak_reserved_spread_gib", "mean"),
        )
        .reset_index()
    )
    settings = table.drop_duplicates("condition_id").set_index("condition_id")[swept]
    scaling = by_condition.join(settings, on="condition_id")
    one_gpu = scaling[scaling["world_size"] == 1]
    if workload:
        reference = (
            one_gpu.groupby(workload, dropna=False)["tokens_per_second"].mean().rename("one_gpu_tokens_per_second")
        )
        scaling = scaling.join(reference, on=workload)
    else:
        scaling["one_gpu_tokens_per_second"] = one_gpu["tokens_per_second"].mean() if len(one_gpu) else float("nan")
    scaling["ideal_tokens_per_second"] = scaling["one_gpu_tokens_per_second"] * scaling["world_size"]
    scaling["scaling_efficiency"] = scaling["tokens_per_second"] / scaling["ideal_tokens_per_second"]
    return scaling[[*swept, *SCALING_COLUMNS]].reset_index(drop=True)
