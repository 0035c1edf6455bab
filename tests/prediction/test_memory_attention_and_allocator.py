"""What the memory model says of the `attention` and `allocator` settings: attentions that keep the scores are not
predicted (with the reason), the fused kernels are predicted alike, and expandable segments leave the prediction as
the default allocator's, with a note saying so."""

import dataclasses

import pytest

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction import memory
from finetune_bench.prediction.shapes import NoPrediction, model_config, model_shape

BASE = TrainingArgs(model_name="random:llama-3.2-1b", dtype="bfloat16", device="cuda", max_seq_length=2048)
SHAPE = model_shape(model_config("random:llama-3.2-1b"))


@pytest.mark.parametrize("attention", ["eager", "math"])
def test_attention_that_keeps_the_scores_is_not_predicted(attention):
    with pytest.raises(NoPrediction, match=f"attention '{attention}' keeps each layer's sequence × sequence"):
        memory.predict_memory(dataclasses.replace(BASE, attention=attention), SHAPE)


@pytest.mark.parametrize("attention", ["flash", "efficient", "cudnn"])
def test_a_pinned_fused_kernel_is_predicted_as_sdpa(attention):
    sdpa = memory.predict_memory(BASE, SHAPE)
    assert memory.predict_memory(dataclasses.replace(BASE, attention=attention), SHAPE) == sdpa


def test_expandable_segments_keep_the_default_reserve_and_say_so():
    default = memory.predict_memory(BASE, SHAPE)
    expandable = memory.predict_memory(dataclasses.replace(BASE, allocator="expandable_segments"), SHAPE)
    assert expandable.peak_reserved_bytes == default.peak_reserved_bytes
    assert expandable.assumptions == [*default.assumptions, memory.EXPANDABLE_SEGMENTS_NOTE]
    assert memory.EXPANDABLE_SEGMENTS_NOTE not in default.assumptions
