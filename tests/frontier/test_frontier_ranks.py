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


def _search_on_two_ranks(tmp_path, dataset_dir, model_dir, cap: int = 4, confirmations: int = 1):
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
        confirmations=confirmations,
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
    whose probes all train on both ranks, finds batch 1 (two probes: no confirmation, to keep the test short; the
    slow test below confirms)."""
    monkeypatch.setenv(FAULT_ENV, "oom@1:*per_device_train_batch_size=2*@rank1")
    monkeypatch.chdir(tmp_path)
    result = _search_on_two_ranks(tmp_path, tiny_dataset_dir, tiny_model_dir, cap=4, confirmations=0)
    assert result.status == FOUND, result.reason
    assert (result.frontier, result.first_oom) == (1, 2)
    by_value = {}
    for probe in result.probes:
        by_value.setdefault(probe.value, []).append(probe)
    assert [p.status for p in by_value[1]] == ["ok"]
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
    assert [p.phase for p in result.probes][-1] == CONFIRMATION and result.probes[-1].status == "ok"
    oom = next(p for p in result.probes if p.status == "oom")
    assert oom.failed_phase == "set-up" and oom.failed_rank in (0, 1)
    assert _leftover_workers(tmp_path) == []


def test_every_layout_but_one_gpu_has_a_module_level_elastic_search_task():
    """As the benchmark's train tasks: a pod of the layout's GPUs (several nodes: a PyTorchJob), found in its container
    by module and name."""
    from collections import OrderedDict

    from flytekit.models.task import Resources
    from flytekit.tools.translator import get_serializable

    import tasks.frontier_ranks
    from finetune_bench.inputs.catalog import GPUS_PER_NODE, NODE_COUNTS
    from tasks.frontier_ranks import ELASTIC_SEARCH_TASKS, elastic_search_task_name
    from tests.workflows.compiled import SETTINGS

    assert set(ELASTIC_SEARCH_TASKS) == {(n, g) for n in NODE_COUNTS for g in GPUS_PER_NODE} - {(1, 1)}
    for (nodes, gpus), elastic in ELASTIC_SEARCH_TASKS.items():
        assert elastic.name == f"tasks.frontier_ranks.{elastic_search_task_name(nodes, gpus)}"
        assert getattr(tasks.frontier_ranks, elastic_search_task_name(nodes, gpus)) is elastic
    one_node = get_serializable(OrderedDict(), SETTINGS, ELASTIC_SEARCH_TASKS[1, 4]).template
    assert {r.name: r.value for r in one_node.container.resources.requests}[Resources.ResourceName.GPU] == "4"
    two_nodes = get_serializable(OrderedDict(), SETTINGS, ELASTIC_SEARCH_TASKS[2, 4]).template
    assert two_nodes.type == "pytorch" and two_nodes.custom["workerReplicas"]["replicas"] == 2
    assert two_nodes.custom["elasticConfig"]["nprocPerNode"] == 4


def test_the_dynamic_node_maps_searches_on_four_gpus_over_the_layout_s_search_task():
    from flytekit.types.directory import FlyteDirectory

    from finetune_bench.inputs.plan import RunSettings
    from tests.workflows.compiled import compile_dynamic
    from workflows.frontier import run_searches

    args = TrainingArgs(backend="plain_loop", num_gpus=4, parallelism="fsdp")
    searches = [
        FrontierSearch(FrontierArm(arm), BATCH_SIZE, dataclasses.replace(args, arm=arm), 1, 8, 1, 1, 1, 600)
        for arm in ("liger", "baseline")
    ]
    spec = compile_dynamic(
        run_searches,
        searches=searches,
        dataset_dir=FlyteDirectory("s3://bucket/dataset"),
        model_dir=FlyteDirectory("s3://bucket/model"),
        execution=RunSettings(concurrency=2, min_success_ratio=1.0),
    )
    (node,) = spec.nodes
    assert ".map_search_memory_frontier_1x4gpu_" in node.array_node.node.task_node.reference_id.name
