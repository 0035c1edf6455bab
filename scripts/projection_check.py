"""The projection of a whole fine-tune against a measured one: a short benchmark's projection of a fine-tune of the
long run's steps (its results.csv: `projected_fine_tune_s`, with `fine_tune_steps` set to the long run's max_steps)
beside what the long run of the same grid measured (its steps.csv: every step's time, warm-up included), per arm and
point of the other axes; the medians over runs, and the liger-over-baseline ratios of their throughputs.

    python scripts/projection_check.py SHORT_DIR LONG_DIR     (each a workflow's outputs: results.csv, steps.csv)

Prints a Markdown table: projected and measured seconds per arm, the error of each, and both ratios with the error of
the projected one (`scripts/gpu_projection.sh` writes the two directories on a GPU machine). The short runs' median is
over the runs in the answer (`counted`: a cold run left out where its condition has warm ones). Exits 1 when it
compares nothing (no condition both projected and measured): a check that compared nothing has not passed.
"""

import sys
from pathlib import Path

import pandas as pd

from finetune_bench.inputs.settings import axis_names

# The settings a configuration is told by, in both tables (every sweepable axis): the long run may train one
# configuration of the short grid, whose condition ids then differ (the settings do not).
KEYS = axis_names()


def _counted(results: pd.DataFrame) -> pd.DataFrame:
    """The ok runs in the answer (`counted`: a cold run is left out where its condition has warm ones)."""
    kept = results["status"] == "ok"
    if "counted" in results:
        kept &= results["counted"].astype(str).str.lower() == "true"
    return results[kept]


def compare(short: Path, long: Path) -> pd.DataFrame:
    """Per configuration: the short runs' median projection and the long runs' median measured time of all steps."""
    projected = _counted(pd.read_csv(short / "results.csv"))
    steps = pd.read_csv(long / "steps.csv")
    both = [key for key in KEYS if key in projected and key in steps]
    keys = [key for key in both if key == "arm" or projected[key].nunique() > 1] or ["condition_id"]
    projected = projected.groupby(keys)["projected_fine_tune_s"].median()
    measured = steps.groupby([*keys, "run_number"])["step_time_s"].sum().groupby(keys).median()
    out = pd.DataFrame({"projected_s": projected, "measured_s": measured}).dropna()
    out["error"] = out["projected_s"] / out["measured_s"] - 1
    return out


def _label(table: pd.DataFrame, index: tuple) -> str:
    names = table.index.names
    values = index if isinstance(index, tuple) else (index,)
    return ",".join(f"{name}={value}" for name, value in zip(names, values, strict=True))


def main(short: str, long: str) -> int:
    table = compare(Path(short), Path(long))
    if table.empty:
        print("nothing compared: no condition has both a projection (short runs) and a measured time (long runs)")
        return 1
    print("| configuration | projected (s) | measured (s) | error |")
    print("|---|---|---|---|")
    for index, row in table.iterrows():
        print(f"| {_label(table, index)} | {row.projected_s:.1f} | {row.measured_s:.1f} | {row.error:+.1%} |")
    if "arm" in table.index.names:
        flat = table.reset_index()
        others = [name for name in table.index.names if name != "arm"]
        for point, group in flat.groupby(others, dropna=False) if others else [((), flat)]:
            arms = group.set_index("arm")
            if "baseline" not in arms.index:
                continue
            base = arms.loc["baseline"]
            where = _label(table.droplevel("arm") if others else table, point) if others else ""
            for arm, mine in arms.drop(index="baseline").iterrows():
                projected = base.projected_s / mine.projected_s
                measured = base.measured_s / mine.measured_s
                print(
                    f"\n{arm} / baseline throughput{' at ' + where if where else ''}: projected ×{projected:.3f}, "
                    f"measured ×{measured:.3f} (error {projected / measured - 1:+.1%})"
                )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
