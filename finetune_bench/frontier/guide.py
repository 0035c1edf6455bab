"""The memory model as a frontier search's guide: the predicted peak reserved memory at each size of the searched
dimension, and what torch can reserve on the GPU.

Under FSDP2 the guide goes by allocated memory: below the limit such runs reserve far more than they need (the
allocator keeps its cache until it must give it back), so a fit is measured by its allocated peak against the
model's, and the model's reserve at the limit (`prediction.memory.FSDP2_ALLOCATOR_OVERHEAD`) says where the GPU is
full; the first probe starts `FSDP2_GUIDE_MARGIN` below the predicted frontier, the model's allocated peaks being
within 1.2 % of every FSDP2 probe measured (docs/prediction.md)."""

import dataclasses
import logging
from pathlib import Path

from finetune_bench.frontier.search import Guide
from finetune_bench.frontier.settings import FrontierSearch
from finetune_bench.measuring.gpu import gpu_memory_bytes
from finetune_bench.prediction.gpus import emulated_memory_bytes, usable_bytes
from finetune_bench.prediction.grid import sequences_full, shape_of
from finetune_bench.prediction.memory import MemoryPrediction, predict_memory
from finetune_bench.prediction.shapes import NoPrediction

logger = logging.getLogger(__name__)

# How far below its predicted frontier a guided FSDP2 search starts (the model's band there, see the docstring).
FSDP2_GUIDE_MARGIN = 0.03


def memory_guide(
    search: FrontierSearch, gpu_memory_bytes: float | None, model_dir: Path | None = None
) -> tuple[Guide | None, str]:
    """The guide of `search` on a GPU of `gpu_memory_bytes` (None: no guide), or None and why not. A search whose
    probes emulate a smaller GPU (`gpu_memory_cap_gib`) aims at that GPU's memory."""
    if not search.guided:
        return None, "probes.guided is false"
    if not gpu_memory_bytes:
        return None, "no GPU memory to aim at (no NVIDIA GPU visible)"
    gpu_memory_bytes = emulated_memory_bytes(search.training_args, gpu_memory_bytes)
    shape, why = shape_of(search.training_args, str(model_dir) if model_dir else None)
    if shape is None:
        return None, why

    def prediction(value: int) -> MemoryPrediction:
        args = dataclasses.replace(search.training_args, **{search.dimension: value})
        return predict_memory(args, shape, sequences_full(args))

    def predict(value: int) -> float:
        return prediction(value).peak_reserved_bytes

    def predict_allocated(value: int) -> float:
        return prediction(value).peak_allocated_bytes

    try:
        predict(search.start)
    except NoPrediction as reason:
        return None, str(reason)
    limit = usable_bytes(gpu_memory_bytes)
    if search.training_args.sharded_by_fsdp:
        guide = Guide(predict, limit, predict_allocated, margin=FSDP2_GUIDE_MARGIN, by_allocated=True)
        return guide, ""
    return Guide(predict=predict, limit_bytes=limit, predict_allocated=predict_allocated), ""


def search_guide(search: FrontierSearch, model_path: Path) -> Guide | None:
    """The memory model's guide of `search` on this machine's GPU (its `gpu_memory_cap_gib` where set), or None (the
    log says why: the search then doubles)."""
    guide, unguided = memory_guide(search, gpu_memory_bytes(), model_path)
    if guide is None:
        logger.info("%s: doubling search (not guided: %s)", search.dimension, unguided)
    return guide
