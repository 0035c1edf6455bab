"""scripts/hand_loop.py, the bare loop the workflow's figures are set beside, runs on this CPU (`--device cpu`: gloo
between ranks, no memory figures) with each arm component it switches on the way a user's loop would: a check that
the yardstick starts, never a figure."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

SCRIPT = Path(__file__).parents[2] / "scripts" / "hand_loop.py"
TINY = ["--device", "cpu", "--arch", "tiny-llama", "--batch", "2", "--seq", "32", "--steps", "3", "--warmup", "1"]


@pytest.mark.parametrize(
    ("arm", "parallelism"),
    [("float8", "none"), ("float8", "fsdp"), pytest.param("baseline", "ddp", marks=pytest.mark.slow)],
)
def test_the_bare_loop_runs_each_arm_and_layout(arm, parallelism, tmp_path):
    command = [sys.executable, str(SCRIPT), *TINY, "--arm", arm, "--parallelism", parallelism]
    if parallelism != "none":  # two gloo ranks under torchrun, as on a GPU machine with NCCL
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *command[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]  # rank 0's only
    assert line["arm"] == arm and line["parallelism"] == parallelism and line["gpu"] == "cpu"
    assert line["world_size"] == (1 if parallelism == "none" else 2)
    assert len(line["step_times_s"]) == 3 and math.isfinite(line["tokens_per_second"]) and line["tokens_per_second"] > 0
    assert line["peak_allocated_gib"] is None  # no memory figure off a GPU
    assert line["torch"] == torch.__version__ and line["transformers"] == transformers.__version__


@pytest.mark.slow
def test_the_compile_arm_under_fsdp2_with_checkpointing_says_what_dynamo_made_of_it(tmp_path):
    """Two gloo ranks, FSDP2, gradient checkpointing, the compile arm (inductor on a CPU: about a minute): the line
    says how many graphs dynamo compiled and where it broke."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), *TINY,
               "--arm", "compile", "--parallelism", "fsdp", "--gradient-checkpointing"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert line["gradient_checkpointing"] is True and line["compile_graphs"] >= 2
    # FSDP2's hooks are not traced: dynamo breaks its graph around them, and says so
    assert line["compile_graph_breaks"] >= 1 and "(×" in line["compile_graph_break_reasons"]
