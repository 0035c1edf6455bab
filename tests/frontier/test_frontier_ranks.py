"""The memory frontier on several GPUs, on a CPU: a search whose every probe trains on two gloo ranks through the real
Elastic search task and PyTorch Elastic's own launcher; a rank that runs out of memory alone ends its probe at once,
as out of memory, naming the rank and the phase."""

import dataclasses

import pytest

from finetune_bench.frontier.search import CONFIRMATION, FOUND
from finetune_bench.frontier.settings import BATCH_SIZE, FrontierArm, FrontierSearch
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.faults import FAKE_MEMORY_ENV, FAULT_ENV
from tests.running.test_ranks import _leftover_workers


def _search_on_two_ranks(tmp_path, dataset_dir, model_dir, cap: int = 4):
    from flytekit.types.directory import FlyteDirectory

    from tasks.frontier_ranks import ELASTIC_SEARCH_TASKS

    args = dataclasses.replace(
        TrainingArgs(),
        backend="plain_loop",
        device="cpu",
        num_gpus=2,
        parallelism="ddp",
        max_steps=2,
        timing_warmup_steps=1,
        max_seq_length=32,
        arm="baseline",
    )
    search = FrontierSearch(
        arm=FrontierArm(arm="baseline"),
        dimension=BATCH_SIZE,
        training_args=args,
        start=1,
        cap=cap,
        granularity=1,
        retries=0,
        confirmations=1,
        timeout_s=int(__import__("os").environ.get("T_PROBE_TIMEOUT", "240")),
    )
    return ELASTIC_SEARCH_TASKS[1, 2](
        search=search, dataset_dir=FlyteDirectory(str(dataset_dir)), model_dir=FlyteDirectory(str(model_dir))
    )


def test_a_rank_that_runs_out_of_memory_alone_ends_the_probe_and_the_search_finds_the_frontier(
    tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch
):
    """Batch 2 runs out of memory on rank 1 only (an injected fault at its first step's end): the probe ends as out of
    memory at once (rank 0 is stopped, not left in a collective), names rank 1 and where it ran out, and the search,
    whose probes all train on both ranks, finds batch 1 with its confirmation."""
    monkeypatch.setenv(FAULT_ENV, "oom@1:*per_device_train_batch_size=2*@rank1")
    monkeypatch.chdir(tmp_path)
    result = _search_on_two_ranks(tmp_path, tiny_dataset_dir, tiny_model_dir, cap=4)
    assert result.status == FOUND, result.reason
    assert (result.frontier, result.first_oom) == (1, 2)
    by_value = {}
    for probe in result.probes:
        by_value.setdefault(probe.value, []).append(probe)
    assert [p.status for p in by_value[1]] == ["ok", "ok"] and by_value[1][-1].phase == CONFIRMATION
    (oom,) = by_value[2]
    assert oom.status == "oom", oom.reason
    assert oom.reason.startswith("rank 1 (node 0, GPU 1): out of memory at step 2 (between phases)")
    assert (oom.failed_rank, oom.failed_phase) == (1, "between phases")
    assert oom.failed_rank_peak_reserved_bytes is None  # a CPU: no GPU memory figure
    # the other rank did not wait for its peer: the probe took about as long as one that fit
    assert oom.wall_time_s < 2 * max(p.wall_time_s for p in by_value[1]) + 10
    # GPU time: every rank of every probe
    assert result.device_seconds == pytest.approx(2 * sum(p.wall_time_s for p in result.probes))
    assert _leftover_workers(tmp_path) == []


@pytest.mark.slow
def test_a_search_on_two_ranks_under_the_fake_memory_model(tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch):
    """The fake memory model (a baseline probe of batch × length above 64 runs out at set-up, on every rank): batch 1
    fits, 2 does not; both ranks of every probe end alike."""
    monkeypatch.setenv(FAKE_MEMORY_ENV, "64")
    monkeypatch.chdir(tmp_path)
    result = _search_on_two_ranks(tmp_path, tiny_dataset_dir, tiny_model_dir, cap=4)
    assert (result.status, result.frontier, result.first_oom) == (FOUND, 1, 2), result.reason
    oom = next(p for p in result.probes if p.status == "oom")
    assert oom.failed_phase == "set-up" and oom.failed_rank in (0, 1)
    assert _leftover_workers(tmp_path) == []
