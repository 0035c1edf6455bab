"""docs/cluster.md's account of what the tests prove names tests that exist."""

import re

from images.images import PROJECT_ROOT


def test_every_test_file_the_cluster_page_names_exists():
    page = (PROJECT_ROOT / "docs" / "cluster.md").read_text()
    section = page[page.index("## What the tests prove about the cluster path") :]
    named = set(re.findall(r"`(tests/[\w/]+\.py)`", section))
    assert {"tests/cluster/test_cluster_path.py", "tests/sources/test_preparation.py"} <= named
    assert [path for path in sorted(named) if not (PROJECT_ROOT / path).is_file()] == []
    assert "does not prove" in section
