"""What the train task returns: the core result record plus its per-step file as a FlyteFile."""

from dataclasses import dataclass

from flytekit.types.file import FlyteFile

from finetune_bench.results import ConditionResult


@dataclass
class TrainOutput:
    result: ConditionResult
    steps: FlyteFile | None = None
