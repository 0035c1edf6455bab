"""Under a memory cap (a smaller card emulated on a larger one), a frontier whose last fit came closer to the cap than
the memory its run held outside torch's allocator is marked borderline: in the table, the headline and the claim's
verdict, with the margin."""

import dataclasses

import pandas as pd

from finetune_bench.frontier.claims import claim_tables
from finetune_bench.frontier.report import headlines
from finetune_bench.frontier.search import ProbeOutcome, search_frontier
from finetune_bench.frontier.settings import SEQ_LENGTH, FrontierArm, FrontierSearch
from finetune_bench.frontier.tables import frontier_table
from finetune_bench.inputs.catalog import CUDA_CONTEXT_BYTES, GIB
from finetune_bench.inputs.settings import TrainingArgs

CAP_GIB = 40.0


def _search(arm: str) -> FrontierSearch:
    args = TrainingArgs(model_name="random:llama-3-8b", max_steps=2, timing_warmup_steps=1, arm=arm)
    return FrontierSearch(FrontierArm(arm), SEQ_LENGTH, args, 1024, 32768, 1024, 1, 1, 900)


def _probe(fits_up_to: int, reserved_at_edge_gib: float, outside_gib: float, cap: bool = True):
    """A probe that fits up to `fits_up_to` tokens, reserving `reserved_at_edge_gib` there (less below), with
    `outside_gib` outside the allocator."""

    def probe(args: TrainingArgs) -> ProbeOutcome:
        environment = {"gpu_memory_bytes": str(141 * GIB), "device_type": "cuda", "gpu_name": "NVIDIA H200"}
        if cap:
            environment["gpu_memory_cap_gib"] = str(CAP_GIB)
        if args.max_seq_length > fits_up_to:
            return ProbeOutcome(status="oom", reason="out of memory at step 1", environment=environment)
        return ProbeOutcome(
            status="ok",
            peak_reserved_bytes=reserved_at_edge_gib * GIB * args.max_seq_length / fits_up_to,
            outside_allocator_peak_bytes=outside_gib * GIB,
            environment=environment,
        )

    return probe


def test_a_fit_closer_to_the_cap_than_the_memory_outside_the_allocator_is_borderline():
    torch_cap = CAP_GIB - CUDA_CONTEXT_BYTES / GIB
    searches = [_search("liger"), _search("baseline")]
    results = [
        search_frontier(searches[0], _probe(16384, torch_cap - 0.5, outside_gib=0.9)),  # 0.5 GiB left, 0.9 needed
        search_frontier(searches[1], _probe(4096, torch_cap - 6.0, outside_gib=0.9)),
    ]
    table = frontier_table(searches, results).set_index("arm")
    assert table.loc["liger", "cap_headroom_gib"] == pytest_approx(0.5)
    assert table.loc["liger", "outside_allocator_gib"] == pytest_approx(0.9)
    assert table.loc["liger", "borderline"] is True
    assert table.loc["baseline", "borderline"] is False
    line = headlines(table.reset_index())[0]
    assert "liger 16384 (length 17408 runs out of memory; borderline: its last fit came within 0.50 GiB" in line
    assert "0.90 GiB outside torch's allocator: on a real 40 GiB card it may run out of memory)" in line
    assert "baseline 4096 (length 5120 runs out of memory)" in line


def test_without_a_cap_or_the_outside_figure_nothing_is_borderline():
    searches = [_search("liger")]
    for probe in (_probe(8192, 120.0, outside_gib=0.9, cap=False), _probe(8192, CAP_GIB, outside_gib=float("nan"))):
        table = frontier_table(searches, [search_frontier(searches[0], probe)])
        assert table.loc[0, "borderline"] is None
        assert "borderline" not in headlines(table)[0]


def test_a_claim_that_agrees_only_within_the_margin_says_borderline():
    args = TrainingArgs(model_name="random:llama-3-8b", num_gpus=4, parallelism="fsdp", gpu_memory_cap_gib=79.6)
    searches = [
        FrontierSearch(FrontierArm(arm), SEQ_LENGTH, dataclasses.replace(args, arm=arm), 2048, 32768, 1024, 1, 1, 900)
        for arm in ("liger", "baseline")
    ]
    frontiers = pd.DataFrame(
        [
            {"arm": "liger", "dimension": SEQ_LENGTH, "frontier": 16384, "first_oom": 17408, "borderline": True,
             "cap_headroom_gib": 0.31, "outside_allocator_gib": 1.42},
            {"arm": "baseline", "dimension": SEQ_LENGTH, "frontier": 3072, "first_oom": 4096, "borderline": False,
             "cap_headroom_gib": 9.0, "outside_allocator_gib": 1.42},
        ]
    )  # fmt: skip
    claimed, _ = claim_tables("liger-readme-context-length", searches, frontiers)
    verdicts = claimed.set_index("arm")["agrees"]
    expected = "yes, borderline (the last fit within 0.31 GiB of the cap; 1.42 GiB outside the allocator)"
    assert verdicts["liger"] == expected
    assert verdicts["baseline"] == "yes"


def pytest_approx(value: float):
    import pytest

    return pytest.approx(value, abs=1e-6)
