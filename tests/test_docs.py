"""The settings reference in docs/ is the one the settings' declarations generate (`make docs`), and the docs
link only to pages that exist."""

import re
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "scripts"))

from settings_reference import DEFAULT_OUT, render  # noqa: E402


def test_settings_reference_is_up_to_date():
    assert DEFAULT_OUT.read_text() == render(), "docs/settings.md is stale: run `make docs`"


def test_every_setting_is_documented_where_it_is_declared():
    from finetune_bench.frontier.settings import BatchSizeSearch, FrontierArm, ProbeSettings, SeqLengthSearch
    from finetune_bench.inputs.reference import field_docs
    from finetune_bench.inputs.settings import TrainingArgs

    for cls in (TrainingArgs, FrontierArm, BatchSizeSearch, SeqLengthSearch, ProbeSettings):
        undocumented = [name for name, doc in field_docs(cls).items() if not doc]
        assert not undocumented, f"{cls.__name__}: no comment documents {undocumented}"


def test_relative_links_in_the_docs_resolve():
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(PROJECT_ROOT)} -> {target}")
    assert not broken, broken
