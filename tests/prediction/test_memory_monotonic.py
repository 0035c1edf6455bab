"""The memory model never predicts less for a larger batch or a longer sequence, over every bundled model and arm:
each moment adds its own allocator overhead, so the moment whose reserve is larger sets the peak."""

import pytest

from finetune_bench.inputs.catalog import architectures
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction.grid import shape_of
from finetune_bench.prediction.memory import predict_memory
from finetune_bench.prediction.shapes import NoPrediction

BATCHES = [1, 2, 4, 8, 16, 24, 32]
LENGTHS = [128, 512, 1024, 2048, 4096]
MODELS = [name for name in architectures() if not name.startswith("tiny-")] + ["tiny-llama"]
ARMS = ["baseline", "liger", "liger-without-loss"]


def _reserved(model: str, arm: str, batch: int, length: int, **more) -> float | None:
    args = TrainingArgs(
        model_name=f"random:{model}", arm=arm, backend="plain_loop", dtype="bfloat16", device="cuda",
        per_device_train_batch_size=batch, max_seq_length=length, **more,
    )  # fmt: skip
    shape, why = shape_of(args)
    if shape is None:  # a model type the memory model does not model: nothing predicted (the plan says why)
        assert "no memory model" in why
        return None
    try:
        return predict_memory(args, shape).peak_reserved_bytes
    except NoPrediction:
        return None


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("arm", ARMS)
def test_a_larger_batch_or_a_longer_sequence_never_reserves_less(model, arm):
    for more in ({}, {"gradient_checkpointing": True}):
        for length in LENGTHS:
            peaks = [_reserved(model, arm, batch, length, **more) for batch in BATCHES]
            known = [peak for peak in peaks if peak is not None]
            assert known == sorted(known), f"{model} {arm} {more} at {length} tokens over batches {BATCHES}: {peaks}"
        for batch in (1, 8, 24):
            peaks = [_reserved(model, arm, batch, length, **more) for length in LENGTHS]
            known = [peak for peak in peaks if peak is not None]
            assert known == sorted(known), f"{model} {arm} {more} at batch {batch} over lengths {LENGTHS}: {peaks}"
