"""The frontier workflow's dry run: where the memory model puts each search's frontier on the target GPU."""

import dataclasses

import pandas as pd

from finetune_bench.frontier.guide import memory_guide
from finetune_bench.frontier.search import largest_predicted_fit
from finetune_bench.frontier.settings import FrontierSearch, arm_name
from finetune_bench.prediction.gpus import GIB
from finetune_bench.prediction.grid import RUN_OVERHEAD_S, Target, sequences_full
from finetune_bench.prediction.memory import predict_memory
from finetune_bench.prediction.shapes import model_config, model_shape

# Probes a guided search takes when the model is within its error band (3-4, confirmation included;
# tests/frontier/test_frontier.py), for the GPU-time estimate.
GUIDED_PROBES = 4


def predicted_frontiers(searches: list[FrontierSearch], target: Target) -> pd.DataFrame:
    """One row per search: the predicted frontier on `target` (the largest size whose predicted peak reserved
    memory stays within what torch can reserve), that peak, and the GPU time of a guided search (4 probes'
    start-up)."""
    rows = []
    for search in searches:
        row = {"arm": arm_name(search.arm), "dimension": search.dimension, "start": search.start, "cap": search.cap}
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
        row["predicted_gpu_seconds"] = GUIDED_PROBES * RUN_OVERHEAD_S
        rows.append(row)
    return pd.DataFrame(rows)
