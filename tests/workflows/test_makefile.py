"""Leaving `make` is no trap: `make help` lists every target from the Makefile itself, and a run that fails before
it writes anything leaves no empty runs/<timestamp>/ behind."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(*args: str) -> subprocess.CompletedProcess:
    # -o: take the installed environment as it is (never reinstall from a test)
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_help_lists_every_target_with_one_line():
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    for command in (["help"], []):  # `make` alone is `make help`
        done = _make(*command)
        assert done.returncode == 0, done.stderr
        listed = dict(re.findall(r"^  make (\S+)\s+(\S.*)$", done.stdout, re.M))
        assert sorted(listed) == sorted(phony), "every target, each once, with its line"
        assert listed["demo"].startswith("the offline CPU smoke run")


def test_a_run_refused_before_it_starts_leaves_no_empty_run_directory(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training_args:\n  max_stepz: 3\n")
    run_dir = tmp_path / "runs" / "refused"
    done = _make("run", f"INPUTS={bad}", f"RUN_DIR={run_dir}")
    assert done.returncode != 0
    assert "max_stepz" in done.stdout + done.stderr
    assert not run_dir.exists()


def test_the_plan_targets_the_gpu_the_inputs_file_names_and_says_when_it_assumes_one(tmp_path):
    """`make plan` adds its default GPU only where neither the file (`accelerator`, `gpu_kind`) nor PLAN_ARGS names
    one, and says so: a file's accelerator is never overridden silently."""
    named = tmp_path / "named.yaml"
    named.write_text("training_args:\n  device: cuda\naccelerator: H200\n")
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("training_args:\n  device: cuda\n")
    run_dir = f"RUN_DIR={tmp_path / 'runs'}"
    planned = _make("-n", "plan", f"INPUTS={named}", run_dir).stdout
    assert "--dry_run" in planned and "--gpu_kind" not in planned and "planning for" not in planned
    planned = _make("-n", "plan", f"INPUTS={unnamed}", run_dir).stdout
    assert "--dry_run --gpu_kind H100" in planned
    assert f"planning for an H100: {unnamed} names no accelerator or gpu_kind" in planned
    planned = _make("-n", "plan", f"INPUTS={unnamed}", "PLAN_ARGS=--gpu_kind L4", run_dir).stdout
    assert "--gpu_kind H100" not in planned and "--gpu_kind L4" in planned
