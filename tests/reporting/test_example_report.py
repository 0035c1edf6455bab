"""The GPU example report in docs/examples/ is the current renderer's: rendered again from its stored runs, its
answer (the headline card and the Summary's verdict lines) is the committed one's, and it leads with the projection
of the whole fine-tune, which change buys most, and the cold runs it left out."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "variable-length-llama1b-h200"


def answer(report: str) -> list[str]:
    """The report's answer as text: the headline card's figures and the Summary's verdict lines."""
    figures = re.findall(r'<span class="big">(.*?)</span><span class="label">(.*?)</span>', report)
    verdicts = [re.sub(r"<[^>]+>", "", line) for line in re.findall(r'<p class="verdict">(.*?)</p>', report)]
    return [f"{value} {label}" for value, label in figures] + verdicts


def test_the_example_report_is_rendered_from_its_stored_runs_by_the_current_renderer(tmp_path):
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE / "runs", copy / "runs")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "example_report.py"), str(copy), "--fine-tune-epochs", "1"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    fresh, committed = (copy / "report.html").read_text(), (EXAMPLE / "report.html").read_text()
    assert answer(fresh) == answer(committed), "the example report is stale: run `make example-report`"
    lines = answer(fresh)
    assert lines[0].endswith("your fine-tune (1 epoch), projected over 2 conditions") and "NVIDIA H200" in fresh
    assert any(line.startswith("liger: your fine-tune (1 epoch: 300 steps, ") for line in lines)
    # the two cold first runs (kernels compiled for the machine) are named and kept out of every figure above
    assert "2 cold run(s) left out" in fresh and "arm=baseline,packing=False#0" in fresh
    assert "Which change buys most, your fine-tune (1 epoch): as configured" in fresh
