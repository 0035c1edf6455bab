"""Before the first step the recorder freezes what is alive (gc.freeze): a full collection inside the timed steps
walks only what the steps create, not every object of torch and transformers."""

import gc

import torch

from finetune_bench.measuring.steps import StepRecorder


def _walked_by_the_collector(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())  # the frozen (permanent) generation is not among them


def test_the_objects_alive_before_the_first_step_are_frozen_until_training_ends():
    gc.unfreeze()
    before = []  # a container: tracked by the collector
    assert _walked_by_the_collector(before)
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    try:
        assert gc.get_freeze_count() > 10_000  # the interpreter's, torch's and the test's objects
        assert not _walked_by_the_collector(before)
        cycle = []
        cycle.append(cycle)  # garbage the steps make is still collected
        del cycle
        assert gc.collect() >= 1
    finally:
        recorder.end_training()
    assert gc.get_freeze_count() == 0 and _walked_by_the_collector(before)
