"""What the train task returns: the core result record plus its per-step file as a FlyteFile, and its profile
directory (trace, memory snapshot, per-kernel table) when it was profiled."""

from dataclasses import dataclass

from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.results.record import RunResult


@dataclass
class TrainOutput:
    result: RunResult
    steps: FlyteFile | None = None
    profile: FlyteDirectory | None = None
