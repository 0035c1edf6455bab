"""Published memory claims a frontier can be checked against: what was claimed, on what setup, and the same
questions asked of what the searches measured.

An inputs file names one with the workflow's `claim` input (`CLAIMS`' keys); the report then sets the claim and the
measurement side by side, with the claim's setup beside the searches' so that every difference shows
(`claim_tables`, shown by the report's section `claim_html`). A claim is about one searched dimension: the search of
that dimension must run."""

import html
from dataclasses import dataclass

import pandas as pd

from finetune_bench.frontier.settings import SEARCH_SECTIONS, SEQ_LENGTH, FrontierSearch, arm_name
from finetune_bench.frontier.simulated import SIMULATED
from finetune_bench.frontier.tables import for_display, is_borderline
from finetune_bench.inputs.errors import SpecError, closest
from finetune_bench.reporting.html import wrapping_table_html


@dataclass(frozen=True)
class Claim:
    """A published claim about how far each arm goes along one dimension before it runs out of memory."""

    source: str
    statement: str
    dimension: str
    # Per arm: (the largest size claimed to train or None, the smallest claimed to run out of memory or None).
    frontiers: dict[str, tuple[int | None, int | None]]
    # The setup it was measured on, by the names of this project's settings where it has them.
    setup: dict[str, str]


CLAIMS = {
    "liger-readme-context-length": Claim(
        source="Liger-Kernel's README (benchmark note 2)",
        statement="HuggingFace models start to OOM at a 4K context length, whereas Liger Kernel scales up to 16K.",
        dimension=SEQ_LENGTH,
        frontiers={"baseline": (None, 4096), "liger": (16384, None)},
        setup={
            "model": "LLaMA 3-8B",
            "per_device_train_batch_size": "8",
            "dtype": "bf16",
            "optim": "AdamW",
            "gradient_checkpointing": "True",
            "parallelism": "FSDP1",
            "GPUs": "8 A100 (80 GB)",
        },
    ),
}


def check_claim(name: str, searches: list[FrontierSearch]) -> None:
    """`name` is a known claim, and the searches include its dimension's, for every arm it names (an arm not searched
    would leave its half of the claim unanswered)."""
    if not name:
        return
    if name not in CLAIMS:
        raise SpecError(f"claim: no claim {name!r}{closest(name, list(CLAIMS))}; known: {list(CLAIMS)}")
    claim = CLAIMS[name]
    section = SEARCH_SECTIONS[claim.dimension]
    mine = [search for search in searches if search.dimension == claim.dimension]
    if not mine:
        raise SpecError(f"claim {name!r} is about {claim.dimension}, which no search probes: enable {section}")
    searched = list(dict.fromkeys(arm_name(search.arm) for search in mine))
    missing = [arm for arm in claim.frontiers if arm not in searched]
    if missing:
        listed = ", ".join(f"{{arm: {arm}}}" for arm in missing)
        raise SpecError(
            f"claim {name!r} is about the arms {' and '.join(claim.frontiers)}, and arms has no "
            f"{' and no '.join(missing)} (it searches {', '.join(searched)}): the claim's "
            f"{' and '.join(missing)} half would go unanswered; add {listed} to arms, or leave claim out"
        )
    # the verdict would read "no" for a size never tried: the searches must reach every size the claim names
    claimed = [size for pair in claim.frontiers.values() for size in pair if size is not None]
    cap, start = max(search.cap for search in mine), min(search.start for search in mine)
    if claimed and (max(claimed) > cap or min(claimed) < start):
        raise SpecError(
            f"claim {name!r} names {claim.dimension} {min(claimed):,} to {max(claimed):,}, which the search from "
            f"{section}.start {start} to {section}.cap {cap} cannot reach: set {section}.start to at most "
            f"{min(claimed)} and {section}.cap to at least {max(claimed)}"
        )


def check_claim_on_a_gpu(name: str, device: str, gpu_here: bool, simulated: bool = False) -> None:
    """A claim is about GPU memory: the probes that check it must train on a GPU (`device` cuda, or auto where
    `gpu_here`: a cluster's pods, a dry run's target, a local machine with one). On a CPU nothing runs out of GPU
    memory and the verdict would say nothing of the claim; under the fake memory model (`simulated`, a test of the
    report) the report says its verdict is simulated."""
    if not name or simulated or device == "cuda" or (device == "auto" and gpu_here):
        return
    where = f"training_args.device {device!r}" + ("" if device == "cpu" else ", and this machine has no GPU")
    raise SpecError(
        f"claim {name!r} is about GPU memory, and the probes would train on a CPU ({where}), where nothing runs out "
        "of GPU memory: its verdict would say nothing of the claim; run on a GPU (device cuda, or auto on a machine "
        "or cluster with one), or leave claim out"
    )


def claim_tables(name: str, searches: list[FrontierSearch], frontiers: pd.DataFrame) -> tuple[pd.DataFrame, ...]:
    """(claimed against measured, one row per arm the claim names; the claim's setup against the searches' own, one
    row per setting). An arm the searches did not probe is measured as "not searched"."""
    claim = CLAIMS[name]
    rows = []
    measured = frontiers[frontiers["dimension"] == claim.dimension].set_index("arm")
    for arm, (fits, runs_out) in claim.frontiers.items():
        row = {
            "arm": arm,
            "claimed: trains up to": fits,
            "claimed: runs out of memory at": runs_out,
        }
        if arm in measured.index:
            found = measured.loc[arm]
            row["measured: trains up to"] = found.get("frontier")
            row["measured: runs out of memory at"] = found.get("first_oom")
            row["agrees"] = _agrees(fits, runs_out, found.get("frontier"), found.get("first_oom"))
            if row["agrees"] == "yes" and is_borderline(found.get("borderline")):
                # the claimed size trains only within the memory the run held outside the allocator of the cap
                row["agrees"] = (
                    f"yes, borderline (the last fit within {found['cap_headroom_gib']:.2f} GiB of the cap; "
                    f"{found['outside_allocator_gib']:.2f} GiB outside the allocator)"
                )
        else:
            row["measured: trains up to"] = row["measured: runs out of memory at"] = None
            row["agrees"] = "not searched"
        rows.append(row)
    search = next(s for s in searches if s.dimension == claim.dimension)
    setup = _setup_of(search)
    setups = [
        {"setting": key, "claim": value, "this frontier": setup.get(key, "")} for key, value in claim.setup.items()
    ]
    return pd.DataFrame(rows), pd.DataFrame(setups)


def claim_html(name: str, searches: list[FrontierSearch], frontiers: pd.DataFrame, simulated: bool) -> str:
    """The claim named `name` beside what the searches measured, and its setup beside theirs."""
    claim = CLAIMS[name]
    claimed, setups = claim_tables(name, searches, frontiers)
    note = f" ({SIMULATED}: this checks the report, not the claim)" if simulated else ""
    return (
        f"<h3>The claim and the measurement</h3><p>{html.escape(claim.source)}: “{html.escape(claim.statement)}” "
        f"Along {html.escape(claim.dimension)}: what it says of each arm, and what the searches measured"
        f"{html.escape(note)}. agrees: the size claimed to train trains here, and the size claimed to run out of "
        "memory is at or above the first size that ran out here.</p>"
        + wrapping_table_html(for_display(claimed))
        + "<p>The setups: the claim's as its source states it, this frontier's from its settings.</p>"
        + wrapping_table_html(setups)
    )


def _agrees(fits: int | None, runs_out: int | None, frontier: object, first_oom: object) -> str:
    """Whether what was measured agrees with what was claimed: the claimed size trains (it is at most the measured
    frontier) and the claimed out-of-memory size does not (it is at least the first size measured to run out)."""
    verdicts = []
    if fits is not None:
        verdicts.append(pd.notna(frontier) and fits <= int(frontier))
    if runs_out is not None:
        verdicts.append(pd.notna(first_oom) and runs_out >= int(first_oom))
    return "yes" if all(verdicts) else "no"


def _setup_of(search: FrontierSearch) -> dict[str, str]:
    t = search.training_args
    gpus = f"{t.world_size}" + (f" (each capped to {t.gpu_memory_cap_gib:g} GiB)" if t.gpu_memory_cap_gib else "")
    return {
        "model": t.model_name,
        "per_device_train_batch_size": str(t.per_device_train_batch_size),
        "dtype": t.dtype,
        "optim": t.optim,
        "gradient_checkpointing": str(t.gradient_checkpointing),
        "parallelism": {"fsdp": "FSDP2", "ddp": "DDP"}.get(t.parallelism, t.parallelism) if t.world_size > 1 else "",
        "GPUs": gpus,
    }
