"""Where the runs happened: the Summary's environment table (GPU, its memory, driver, versions)."""

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.measuring.environment import PROJECT, RECORDED_PACKAGES
from finetune_bench.reporting.html import compact_table_html

ENVIRONMENT_KEYS = (
    "gpu_name",
    "gpu_count",
    "gpu_memory_gib",
    "driver",
    "cuda",
    "cpu",
    "hostname",
    *RECORDED_PACKAGES,
    "python",
    "lock_sha256",
    PROJECT,
    "code_commit",
)
# What the table shows before its toggle (every recorded key is behind it).
KEY_ENVIRONMENT = ("gpu_name", "gpu_count", "gpu_memory_gib", "driver", "cuda", "cpu", "torch", "liger-kernel",
                   "transformers", "python")  # fmt: skip


def environment_html(a: GridAnalysis) -> str:
    """The recorded environment as a one-row table ("" when nothing was recorded)."""
    items = {key: a.environment[key] for key in ENVIRONMENT_KEYS if key in a.environment}
    if a.capacity_gib:
        items["gpu_memory_gib"] = f"{a.capacity_gib:.1f}"
    if not items:
        return ""
    return "<h3>Environment</h3>" + compact_table_html(pd.DataFrame([items]), KEY_ENVIRONMENT, "the environment")
