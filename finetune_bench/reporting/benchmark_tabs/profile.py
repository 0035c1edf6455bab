"""The Profile tab (runs with `profile: true`): where the profiled steps' time went, by kernel category and by
kernel, and the runs whose profile failed."""

import html

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.analysis.tables import profile_categories  # noqa: E402
from finetune_bench.inputs.arms import BASELINE  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import panels, with_arm  # noqa: E402
from finetune_bench.reporting.html import arm_palette, figure_html, table_html  # noqa: E402

TOP_KERNELS = 10


def profile_tab(a: GridAnalysis) -> str | None:
    """The profiled steps, and the runs whose profile failed (no tab when no run was profiled)."""
    table = a.table
    failed = table[table.get("profile_error", pd.Series("", index=table.index)).fillna("").astype(str) != ""]
    if a.profile.empty and failed.empty:
        return None
    content = ""
    if not failed.empty:
        items = "".join(
            f"<li>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.profile_error)}</li>"
            for row in failed.itertuples(index=False)
        )
        content += (
            '<div class="warning"><b>Profiles that failed.</b> These runs were measured (their figures stand); '
            f"the profile after their timed steps did not complete:<ul>{items}</ul></div>"
        )
    if not a.profile.empty:
        content += profile_html(a.profile, a.swept)
    return content


def profile_html(profile: pd.DataFrame, swept: list[str]) -> str:
    """Where the profiled steps' time went, per arm: time per category (and each arm's difference from the
    baseline), then the kernels that took the most."""
    categories = profile_categories(profile, swept)
    facets = [axis for axis in swept if axis != "arm" and axis in categories]
    data = with_arm(categories).copy()
    data["panel"] = panels(data, facets)
    parts = [
        "<p>After the timed steps, each profiled run took <code>profile_steps</code> more steps under "
        "torch.profiler (the timed steps are not affected). Time per step by category of GPU kernel (on a CPU, "
        "of operator, by self time), median over the condition's profiled runs. The categories come from the "
        "kernels' names: PyTorch's generic elementwise and reduction kernels (an unfused RMSNorm's multiplies and "
        "means, for instance) are <i>elementwise (unattributed)</i>. Each run's Chrome trace and CUDA memory "
        "snapshot are in the outputs, under <code>profiles/</code>.</p>"
    ]
    palette = arm_palette(data["arm"])
    grid = sns.catplot(
        data=data, x="time_ms_per_step", y="category", hue="arm", hue_order=list(palette), palette=palette,
        col="panel", col_wrap=min(data["panel"].nunique(), 2) if data["panel"].nunique() > 1 else None,
        kind="bar", height=3.6, aspect=1.5, orient="h", sharex=False,
    )  # fmt: skip
    grid.set_titles("{col_name}")
    grid.set_axis_labels("ms per step", "")
    grid.figure.suptitle("Profiled time per step by category", y=1.02)
    parts.append(figure_html(grid.figure, "profiled time by category"))
    for panel, rows in data.groupby("panel", sort=False):
        wide = rows.pivot_table(index="category", columns="arm", values="time_ms_per_step", aggfunc="sum")
        if BASELINE in wide:
            for arm in [a for a in wide.columns if a != BASELINE]:
                wide[f"{arm} − baseline"] = wide[arm] - wide[BASELINE]
        wide.loc["total"] = wide.sum()
        title = f"<h4>{html.escape(str(panel))}</h4>" if panel else ""
        parts.append(title + table_html(wide.round(3).reset_index()))
    keys = [axis for axis in swept if axis in profile] or ["condition_id"]
    top = (
        profile.groupby([*keys, "name", "category"], dropna=False)["time_ms_per_step"]
        .median()
        .reset_index()
        .sort_values("time_ms_per_step", ascending=False)
        .groupby(keys, dropna=False)
        .head(TOP_KERNELS)
    )
    parts.append(f"<h3>Top kernels</h3><p>The {TOP_KERNELS} that took the most time per step, per condition.</p>")
    parts.append(table_html(top.round(4)))
    return "".join(parts)
