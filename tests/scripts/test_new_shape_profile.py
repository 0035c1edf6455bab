"""scripts/new_shape_profile.py, the profile of the steps that meet a new batch shape, runs on this CPU with a tiny
model and short generated examples (a smoke check, never a figure): a row per step, a shape new where the run met it
first, and the steady step's profile tabulated."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "new_shape_profile.py"
# short examples and a short window: batches of 2 whose lengths differ, some of them repeated within 6 steps
TINY = ["--model", "random:tiny-llama", "--steps", "6", "--device", "cpu", "--dtype", "float32"]
SHORT = ["synthetic_num_examples=64", "synthetic_min_words=5", "synthetic_max_words=40", "max_seq_length=128",
         "per_device_train_batch_size=2", "timing_warmup_steps=1"]  # fmt: skip


def test_the_cpu_smoke_gives_a_row_per_step_with_new_shapes_where_first_met(tmp_path):
    command = [sys.executable, str(SCRIPT), *TINY, *(f"--set={s}" for s in SHORT), "--out", str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["arm"] == "baseline" and line["device"] == "cpu" and line["profiled"] is True
    steps = line["steps"]
    assert [row["step"] for row in steps] == [1, 2, 3, 4, 5, 6]
    shapes = [row["shape"] for row in steps]
    assert all(shape.startswith("2x") for shape in shapes)
    assert [row["new_shape"] for row in steps] == [shape not in shapes[:i] for i, shape in enumerate(shapes)]
    assert len(set(shapes)) < len(shapes) and len(set(shapes)) > 1  # the flags were put to the test both ways
    assert all(row["seconds"] > 0 and row["mallocs"] is None for row in steps)  # no allocator off a GPU
    assert any(table["why"] == "steady" for table in line["profiles"].values())
    for table in line["profiles"].values():
        assert table["top_self_cpu"] and not table["top_self_cuda"]  # CUDA columns empty on a CPU
    assert json.loads((tmp_path / "out" / "new_shape_profile.json").read_text())["steps"] == steps
    assert "top by self CPU time" in (tmp_path / "out" / "report.txt").read_text()
