"""The Versions tab (a grid that sweeps `software_set`): should I upgrade? Per arm and point of the other axes, each
set of package releases against the reference set, in throughput, memory, energy and loss; then what each set
imported."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.parity import LOSS_ATOL, LOSS_RTOL
from finetune_bench.analysis.stats import CONFIDENCE_LEVEL, MIN_PAIRS_FOR_CI
from finetune_bench.analysis.versions import (
    SOFTWARE_SET,
    imported_versions_table,
    reference_set,
    set_label,
    sweeps_software,
)
from finetune_bench.reporting.benchmark_tabs.cells import MISSING, has_values, pairs_text, ratio_text
from finetune_bench.reporting.benchmark_tabs.summary import cpu_timings_note
from finetune_bench.reporting.html import table_html

# Each compared metric: its column prefix in the versions table and its name in the tab.
COMPARED = (
    ("throughput", "throughput"),
    ("steady_throughput", "steady-state throughput"),
    ("peak_allocated", "peak allocated memory"),
    ("peak_reserved", "peak reserved memory"),
    ("energy_per_token", "energy per token"),
)


def versions_shown(versions: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """The versions table as a reader wants it: arm, point, set, pairs, each measured ratio [CI], the throughput's p
    and significance, the final loss's difference, the loss verdict and the note."""
    others = [axis for axis in swept if axis not in ("arm", SOFTWARE_SET)]
    out = versions[["arm", *others]].assign(**{"software set": versions[SOFTWARE_SET].map(set_label)})
    out["pairs"] = versions["pairs"]
    for name, label in COMPARED:
        if not has_values(versions, f"{name}_ratio"):  # energy: not measured here
            continue
        bounds = (versions[f"{name}_ci_low"], versions[f"{name}_ci_high"])
        out[f"{label} ×"] = [ratio_text(*values) for values in zip(versions[f"{name}_ratio"], *bounds, strict=True)]
        if name == "throughput":
            out["throughput p"] = versions["throughput_p_value"]
            out["throughput significant"] = versions["throughput_significant"]
    out["final loss difference"] = versions["final_loss_difference"].map(
        lambda v: f"{v:+.4f}" if pd.notna(v) else MISSING
    )
    out["loss parity"] = [loss_parity_text(row) for row in versions.itertuples(index=False)]
    out["note"] = versions["note"]
    return out


def loss_parity_text(row: tuple) -> str:
    """A set's loss parity cell: "match (3 of 3 loss curves)", "differs (1 of 3 final loss)"; "–" where no loss was
    compared."""
    if not row.loss_verdict:
        return MISSING
    return f"{row.loss_verdict} ({int(row.loss_matches)} of {int(row.loss_pairs)} {row.loss_compared})"


def imported_html(imported: pd.DataFrame) -> str:
    """A small table per set: the releases of its pinned packages its ok runs imported."""
    parts = []
    for software_set, rows in imported.groupby(SOFTWARE_SET, sort=False):
        parts.append(f"<h4>{html.escape(set_label(str(software_set)))}</h4>")
        parts.append(table_html(rows.drop(columns=SOFTWARE_SET)))
    return "".join(parts)


def versions_tab(a: GridAnalysis) -> str | None:
    """Each software set against the reference, arm by arm, and the releases each set imported (no tab where the grid
    did not sweep the set)."""
    if not sweeps_software(a.swept) or a.table.empty:
        return None
    versions = a.versions
    reference = set_label(reference_set(a.table))
    parts = [
        cpu_timings_note(a),
        f"<p>Should I upgrade? Every arm trained under each software set; each set is compared with the reference, "
        f"<b>{html.escape(reference)}</b> (the installed packages where the grid has them, else its first set), at "
        "the same arm and other settings: the geometric mean of the ratios set / reference of runs paired by run "
        "number (same seed, "
        f"same data order; × &gt; 1: faster, or more memory), its {CONFIDENCE_LEVEL:.0%} t interval in "
        f"brackets (from {MIN_PAIRS_FOR_CI} pairs on) and a paired t-test on the logarithms at alpha {a.alpha:g}, as "
        "an arm is compared with the baseline (How sure, in the Summary). Loss parity as an arm's against the "
        f"baseline's: the loss curves step by step where the steps are known, else the final training loss, within "
        f"atol {LOSS_ATOL:g}, rtol {LOSS_RTOL:g}; the final loss difference is the set's minus the reference's, the "
        "median over the pairs.</p>",
    ]
    if versions.empty:
        parts.append("<p>No set has an ok run to compare with the reference's.</p>")
    else:
        parts.extend(f'<p class="verdict">{html.escape(line)}</p>' for line in a.version_verdicts)
        parts.append(f"<p>Over {pairs_text(versions['pairs'])}.</p>" + table_html(versions_shown(versions, a.swept)))
    imported = imported_versions_table(a.table, a.swept)
    if not imported.empty:
        parts.append(
            "<h3>What each set imported</h3><p>Per set, the release of each package it pins that its ok runs "
            "imported (a run checks it against the pin before it trains), and how many runs did.</p>"
            + imported_html(imported)
        )
    return "\n".join(part for part in parts if part)
