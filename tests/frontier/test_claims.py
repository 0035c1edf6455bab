"""A published claim beside what the frontier measured: the claim named, checked at planning, and the report's table
of claimed against measured sizes and setups."""

import pandas as pd
import pytest

from finetune_bench.frontier.claims import check_claim, check_claim_on_a_gpu, claim_tables
from finetune_bench.frontier.settings import BATCH_SIZE, SEQ_LENGTH, FrontierArm, FrontierSearch
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import TrainingArgs

LIGER_CLAIM = "liger-readme-context-length"


def _search(arm: str, dimension: str = SEQ_LENGTH) -> FrontierSearch:
    args = TrainingArgs(
        model_name="random:llama-3-8b", num_gpus=4, parallelism="fsdp", gradient_checkpointing=True,
        per_device_train_batch_size=8, gpu_memory_cap_gib=79.6, arm=arm,
    )  # fmt: skip
    return FrontierSearch(FrontierArm(arm), dimension, args, 2048, 32768, 1024, 1, 1, 900)


def _frontiers(liger: tuple, baseline: tuple) -> pd.DataFrame:
    rows = [
        {"arm": arm, "dimension": SEQ_LENGTH, "frontier": fits, "first_oom": oom}
        for arm, (fits, oom) in (("liger", liger), ("baseline", baseline))
    ]
    return pd.DataFrame(rows)


def test_a_claim_is_known_and_about_a_dimension_that_is_searched():
    searches = [_search("liger"), _search("baseline")]
    check_claim(LIGER_CLAIM, searches)
    check_claim("", searches)
    with pytest.raises(
        SpecError, match=r"claim: no claim 'liger-readme-context'.*did you mean 'liger-readme-context-length'"
    ):
        check_claim("liger-readme-context", searches)
    with pytest.raises(SpecError, match=r"is about max_seq_length, which no search probes: enable seq_length_search"):
        check_claim(LIGER_CLAIM, [_search("liger", BATCH_SIZE)])


def test_a_claim_whose_sizes_the_search_cannot_reach_is_refused():
    """The claim names 4,096 (the baseline runs out) and 16,384 (Liger trains): a cap of 8,192 could only say "no"
    for a size never tried."""
    import dataclasses

    short = [dataclasses.replace(_search(arm), cap=8192) for arm in ("liger", "baseline")]
    expected = (
        r"names max_seq_length 4,096 to 16,384, which the search from seq_length_search.start 2048 to "
        r"seq_length_search.cap 8192 cannot reach: set seq_length_search.start to at most 4096 and "
        r"seq_length_search.cap to at least 16384"
    )
    with pytest.raises(SpecError, match=expected):
        check_claim(LIGER_CLAIM, short)


@pytest.mark.parametrize(
    ("liger", "baseline", "agrees"),
    [
        ((16384, 17408), (3072, 4096), ["yes", "yes"]),  # as measured on four H200s capped to 79.6 GiB
        ((15360, 16384), (3072, 4096), ["no", "yes"]),  # liger's 16K ran out of memory
        ((16384, 17408), (4096, 5120), ["yes", "no"]),  # the baseline trained at 4K
        ((16384, None), (None, 2048), ["yes", "yes"]),  # liger reached the cap; the baseline ran out at the start
    ],
)
def test_the_report_says_whether_the_measurement_agrees_with_the_claim(liger, baseline, agrees):
    searches = [_search("liger"), _search("baseline")]
    claimed, setups = claim_tables(LIGER_CLAIM, searches, _frontiers(liger, baseline))
    by_arm = claimed.set_index("arm")
    assert [by_arm.loc[arm, "agrees"] for arm in ("liger", "baseline")] == agrees
    assert by_arm.loc["liger", "claimed: trains up to"] == 16384
    assert by_arm.loc["baseline", "claimed: runs out of memory at"] == 4096
    setup = setups.set_index("setting")["this frontier"]
    assert setup["GPUs"] == "4 (each capped to 79.6 GiB)" and setup["parallelism"] == "FSDP2"
    assert setups.set_index("setting").loc["GPUs", "claim"] == "8 A100 (80 GB)"


def test_an_arm_the_searches_did_not_probe_is_said_so():
    searches = [_search("liger")]
    frontiers = _frontiers((16384, 17408), (None, None)).iloc[:1]
    claimed, _ = claim_tables(LIGER_CLAIM, searches, frontiers)
    assert claimed.set_index("arm").loc["baseline", "agrees"] == "not searched"


def test_the_report_header_names_the_capped_gpu_and_how_many_a_probe_trains_on():
    from finetune_bench.frontier.report import what_was_measured

    searches = [_search("liger"), _search("baseline")]
    environment = {"gpu_name": "NVIDIA H200", "gpu_memory_bytes": str(150 * 2**30), "gpu_memory_cap_gib": "79.6"}
    header = what_was_measured(searches, environment, 79.6, None, pd.DataFrame({"measured_at": []}))
    assert header["hardware"] == "NVIDIA H200 capped to 79.6 GiB (gpu_memory_cap_gib), 4 GPUs a probe"


def test_a_claim_about_an_arm_that_is_not_searched_is_refused():
    """The claim sets Liger against the baseline: without one of them, its half would read "not searched"."""
    with pytest.raises(SpecError) as refused:
        check_claim(LIGER_CLAIM, [_search("compile"), _search("baseline")])
    assert refused.value.problems == [
        "claim 'liger-readme-context-length' is about the arms baseline and liger, and arms has no liger (it searches "
        "compile, baseline): the claim's liger half would go unanswered; add {arm: liger} to arms, or leave claim out"
    ]
    check_claim(LIGER_CLAIM, [_search("compile"), _search("baseline"), _search("liger")])


def test_a_claim_about_gpu_memory_checked_on_a_cpu_is_refused():
    with pytest.raises(SpecError, match=r"^claim 'liger-readme-context-length' is about GPU memory, and the probes "
                       r"would train on a CPU \(training_args.device 'cpu'\).*or leave claim out$"):  # fmt: skip
        check_claim_on_a_gpu(LIGER_CLAIM, "cpu", gpu_here=True)
    with pytest.raises(SpecError, match=r"\(training_args.device 'auto', and this machine has no GPU\)"):
        check_claim_on_a_gpu(LIGER_CLAIM, "auto", gpu_here=False)
    check_claim_on_a_gpu(LIGER_CLAIM, "auto", gpu_here=True)  # a GPU here, a cluster's pods, or a dry run's target
    check_claim_on_a_gpu(LIGER_CLAIM, "cuda", gpu_here=False)
    check_claim_on_a_gpu(LIGER_CLAIM, "cpu", gpu_here=False, simulated=True)  # the fake memory model: a report test
    check_claim_on_a_gpu("", "cpu", gpu_here=False)
