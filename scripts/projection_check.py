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

KEYS = ["condition_id"]


def compare(short: Path, long: Path) -> pd.DataFrame:
    """Per condition: the short runs' median projection and the long runs' median measured time of all steps."""
    projected = pd.read_csv(short / "results.csv")
    kept = projected["status"] == "ok"
    if "counted" in projected:  # the runs in the answer: a cold run is left out where its condition has warm ones
        kept &= projected["counted"].astype(str).str.lower() == "true"
    projected = projected[kept].groupby(KEYS)["projected_fine_tune_s"].median()
    steps = pd.read_csv(long / "steps.csv")
    measured = steps.groupby([*KEYS, "run_number"])["step_time_s"].sum().groupby(KEYS).median()
    out = pd.DataFrame({"projected_s": projected, "measured_s": measured}).dropna()
    out["error"] = out["projected_s"] / out["measured_s"] - 1
    return out


def main(short: str, long: str) -> int:
    table = compare(Path(short), Path(long))
    if table.empty:
        print("nothing compared: no condition has both a projection (short runs) and a measured time (long runs)")
        return 1
    print("| condition | projected (s) | measured (s) | error |")
    print("|---|---|---|---|")
    for condition, row in table.iterrows():
        print(f"| {condition} | {row.projected_s:.1f} | {row.measured_s:.1f} | {row.error:+.1%} |")
    arms = {c.split("arm=")[1].split(",")[0]: c for c in table.index if "arm=" in c}
    if "baseline" in arms:
        base = table.loc[arms["baseline"]]
        for arm, condition in arms.items():
            if arm == "baseline":
                continue
            mine = table.loc[condition]
            projected = base.projected_s / mine.projected_s
            measured = base.measured_s / mine.measured_s
            print(
                f"\n{arm} / baseline throughput: projected ×{projected:.3f}, measured ×{measured:.3f} "
                f"(error {projected / measured - 1:+.1%})"
            )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
