"""Before the first step the recorder freezes what is alive (gc.freeze): a full collection inside the timed steps
walks only what the steps create, not every object of torch and transformers."""

import gc

import torch

from finetune_bench.measuring.steps import StepRecorder


def test_the_objects_alive_before_the_first_step_are_frozen_until_training_ends():
    gc.unfreeze()
    before = object()  # noqa: F841  (alive when training begins)
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the interpreter's, torch's and the test's objects
        during = [object() for _ in range(100)]
        assert gc.get_freeze_count() == frozen  # what the steps create is collected as usual
        del during
        gc.collect()  # collections still run
    finally:
        recorder.end_training()
    assert gc.get_freeze_count() == 0
