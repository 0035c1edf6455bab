"""docs/architecture.md's code layout names every module of the analysis and the reporting, the report's tabs
(reporting/benchmark_tabs/) included, and every workflows/ module."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _layout_entries() -> dict[str, str]:
    """Each entry of the code layout → its text: a package's paragraph (`- **`analysis/`** ...`) and each entry of
    the block of what is around the package (`workflows/`, `tasks/`, ...)."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Code layout", 1)[1].split("\n## ", 1)[0]
    packages = re.findall(r"^- \*\*`([a-z_]+/)`\*\*(.*?)(?=^- |^\S|\Z)", section, flags=re.M | re.S)
    block = section.split("```", 2)[1]
    entries = re.split(r"\n(?=  ?[a-z_]+/\s|[a-z_]+/\s)", block)
    around = {entry.split()[0]: " ".join(entry.split()) for entry in entries if entry.strip()}
    return around | {name: " ".join(text.split()) for name, text in packages}


@pytest.mark.parametrize(
    ("entry", "folder"),
    [
        ("analysis/", "finetune_bench/analysis"),
        ("reporting/", "finetune_bench/reporting"),
        ("reporting/", "finetune_bench/reporting/benchmark_tabs"),
        ("workflows/", "workflows"),
    ],
)
def test_every_module_is_named_in_its_entry(entry, folder):
    text = _layout_entries()[entry]
    if folder.endswith("benchmark_tabs"):
        assert "benchmark_tabs/" in text
    modules = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")
    missing = [name for name in modules if not re.search(rf"(?<![\w/]){re.escape(name)}", text)]
    assert not missing, f"docs/architecture.md's {entry} does not name {missing}"
