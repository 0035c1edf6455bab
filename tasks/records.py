"""What the train task returns: the core result record plus its per-step file as a FlyteFile."""

from dataclasses import dataclass

from flytekit.types.file import FlyteFile

from finetune_bench.results.record import RunResult


@dataclass
class TrainOutput:
    result: RunResult
    steps: FlyteFile | None = None
