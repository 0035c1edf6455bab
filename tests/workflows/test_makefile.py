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
