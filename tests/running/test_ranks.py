"""Runs on several GPUs, on a CPU: two ranks over gloo through the real Elastic train task and PyTorch Elastic's own
launcher (the plain loop's DDP and FSDP2, the Trainer's DDP), a rank that fails, a rank that hangs; and how rank
0 makes the run's result of its ranks' reports."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.metrics import (
    DERIVED,
    MAX,
    MEASURED_TOKENS,
    METRICS,
    PER_TOKEN,
    RANK0,
    RANK_ONLY,
    SUM,
    TOTAL,
    TOTALS,
)
from finetune_bench.results.record import RankSummary, RunResult
from finetune_bench.running.ranks import _MAXIMA, RankReport, combined_metrics, merge_ranks, rank_figure


def _report(rank: int, status: str = "ok", reason: str = "", **totals: float) -> RankReport:
    summary = RankSummary(
        rank=rank,
        node_rank=0,
        local_rank=rank,
        host="h",
        status=status,
        reason=reason,
        tokens_per_second=totals.get("measured_tokens", 0) / totals.get("measured_time_s", 1),
        peak_allocated_bytes=totals.pop("peak_allocated_bytes", None),
        peak_reserved_bytes=totals.pop("peak_reserved_bytes", None),
    )
    return RankReport(summary, totals, error_tail=f"tail of rank {rank}" if status != "ok" else "")


def test_the_run_adds_its_ranks_tokens_over_the_slowest_rank_and_keeps_the_largest_memory():
    reports = [
        _report(0, measured_tokens=1000.0, measured_padded_tokens=1200.0, measured_time_s=2.0,
                peak_allocated_bytes=10.0, peak_reserved_bytes=12.0),
        _report(1, measured_tokens=3000.0, measured_padded_tokens=3200.0, measured_time_s=4.0,
                peak_allocated_bytes=14.0, peak_reserved_bytes=20.0),
    ]  # fmt: skip
    metrics = combined_metrics(reports, gpu_name="")
    assert metrics["tokens_per_second"] == pytest.approx(4000 / 4.0)
    assert metrics["padded_tokens_per_second"] == pytest.approx(4400 / 4.0)
    assert metrics["tokens_per_second_per_gpu"] == pytest.approx(500.0)
    assert metrics["peak_reserved_bytes"] == 20.0 and metrics["peak_reserved_bytes_spread"] == 8.0
    assert metrics["peak_allocated_bytes"] == 14.0 and metrics["peak_allocated_bytes_spread"] == 4.0
    assert "mfu" not in metrics  # no GPU peak known


def test_a_rank_that_measured_nothing_leaves_the_run_without_a_throughput():
    reports = [_report(0, measured_tokens=1000.0, measured_time_s=2.0), _report(1)]
    assert "tokens_per_second" not in combined_metrics(reports, gpu_name="")


def test_the_first_failing_rank_names_the_run_s_status_and_reason():
    rank0 = RunResult(condition_id="c", run_number=0, swept_axes=[], training_args=TrainingArgs(), status="stopped")
    reports = [
        _report(0, status="stopped", reason="stopped: rank 1 failed first"),
        _report(1, status="oom", reason="out of memory at step 3"),
    ]
    merged = merge_ranks(rank0, reports, failed=1)
    assert merged.status == "oom"
    assert merged.reason == "rank 1 (node 0, GPU 1): out of memory at step 3"
    assert merged.error_tail == "tail of rank 1"
    assert [r.status for r in merged.ranks] == ["stopped", "oom"]


def test_the_rank_merge_follows_the_metrics_table_for_each_kind():
    """Every metric of the table, in rank 0's record and in each rank's report with figures of its own: the merged
    record keeps rank 0's, sums the ranks' totals into rates, takes the largest rank's peak, computes what is
    derived and leaves out what is one rank's alone."""
    rank0 = RunResult(
        condition_id="c", run_number=0, swept_axes=[], training_args=TrainingArgs(), status="ok",
        metrics={name: 1000.0 + i for i, name in enumerate(METRICS)},
        environment={"gpu_name": "NVIDIA H100 80GB HBM3"},
    )  # fmt: skip
    reports = []
    for rank in range(3):
        peaks = {name: 10.0 * (rank + 1) + i for i, name in enumerate(("peak_allocated_bytes", "peak_reserved_bytes"))}
        summary = RankSummary(rank, 0, rank, "h", "ok", **peaks, nvml_peak_bytes=50.0 * (rank + 1))
        totals = {name: 100.0 * (rank + 1) + i for i, name in enumerate(TOTALS)}
        # the other largest-rank figures (the timeline's phases, the memory phases' peaks, the batch shapes): the
        # largest rank's stands, whichever rank has it
        maxima = {name: 5.0 + 3 * ((rank + i) % 3) for i, name in enumerate(_MAXIMA)}
        reports.append(RankReport(summary, totals, maxima=maxima))
    merged = merge_ranks(rank0, reports, failed=None).metrics
    for metric in METRICS.values():
        if metric.ranks == RANK0:
            assert merged[metric.name] == rank0.metrics[metric.name], metric.name
        elif metric.ranks == SUM:  # over the slowest rank's time (its measured time, or its steady time)
            summed = sum(report.totals[metric.rate_of] for report in reports)
            slowest_s = max(report.totals[metric.over] for report in reports)
            assert merged[metric.name] == pytest.approx(summed / slowest_s / metric.per), metric.name
        elif metric.ranks == MAX:
            figures = [rank_figure(report, metric.name) for report in reports]
            assert None not in figures, metric.name
            assert merged[metric.name] == max(figures) != rank0.metrics[metric.name], metric.name
            if f"{metric.name}_spread" in METRICS:  # a headline memory peak, with its spread over the ranks
                assert merged[f"{metric.name}_spread"] == max(figures) - min(figures) > 0, metric.name
        elif metric.ranks == TOTAL:
            summed = sum(report.totals[metric.total_of] for report in reports)
            assert merged[metric.name] == pytest.approx(summed / metric.per), metric.name
        elif metric.ranks == PER_TOKEN:
            summed = sum(report.totals[metric.total_of] for report in reports)
            tokens = sum(report.totals[MEASURED_TOKENS] for report in reports)
            assert merged[metric.name] == pytest.approx(summed / tokens), metric.name
        elif metric.ranks == RANK_ONLY:
            assert metric.name not in merged, metric.name
        else:
            assert metric.ranks == DERIVED and metric.name in merged, metric.name
            assert merged[metric.name] != rank0.metrics[metric.name], metric.name
    assert set(merged) <= set(METRICS)
    assert merged["world_size"] == 3


@pytest.fixture
def rank_of_two(monkeypatch):
    """A launch's store (as the elastic agent hosts it) and this process made a rank of a 2-rank launch."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    for name, value in (("GROUP_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)

    def become(rank: int):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        return dist.PrefixStore("finetune_bench/", server)

    return become


def _two_rank_run(tmp_path):
    from finetune_bench.results.store import ResultStore

    args = dataclasses.replace(TrainingArgs(), num_gpus=2, parallelism="ddp", backend="plain_loop", device="cpu")
    run = PlannedRun(condition_id="two-ranks", run_number=0, training_args=args, swept_axes=[])
    return run, ResultStore(str(tmp_path / "store"))


def test_a_rank_that_cannot_start_stops_the_others_and_rank_0_says_why(rank_of_two, tmp_path):
    from finetune_bench.running.ranks import run_on_ranks

    run, store = _two_rank_run(tmp_path)
    launch = rank_of_two(0)

    def no_model():
        raise FileNotFoundError("the model directory is gone")

    result = run_on_ranks(run, store, no_model, tmp_path / "rank0", timeout_s=30)
    assert result.status == "error"
    assert result.reason == ("rank 0 (node 0, GPU 0) could not start: FileNotFoundError: the model directory is gone")
    assert json.loads(launch.get("abort"))["reason"] == result.reason
    # the other rank, waiting for its node's sources, sees the abort and stops without training
    rank_of_two(1)
    assert run_on_ranks(run, store, no_model, tmp_path / "rank1", timeout_s=30) is None


def test_a_rank_whose_peers_never_come_stops_as_a_timeout_and_says_nothing_on_stderr(rank_of_two, tmp_path, capfd):
    from finetune_bench.running.ranks import run_on_ranks

    run, store = _two_rank_run(tmp_path)
    launch = rank_of_two(1)  # rank 0 never sets its node's sources
    started = time.monotonic()
    assert run_on_ranks(run, store, lambda: (tmp_path, tmp_path), tmp_path / "rank1", timeout_s=2) is None
    assert time.monotonic() - started < 15
    abort = json.loads(launch.get("abort"))
    assert abort["status"] == "timeout" and "sources/0 never came" in abort["reason"]
    # a store wait that times out makes torch's C++ client warn on stderr; the rank looks instead
    assert "c10d" not in capfd.readouterr().err


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch):
    """The plugin sets OMP_NUM_THREADS=1 in its caller for good when it is unset (as torchrun does): set here, it
    is restored for the tests that follow."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_a_rank_that_saw_its_peer_go_through_a_collective_is_not_the_cause():
    rank0 = RunResult(condition_id="c", run_number=0, swept_axes=[], training_args=TrainingArgs(), status="error")
    reports = [
        _report(0, status="error", reason="DistBackendError: [Gloo] Connection closed by peer [127.0.0.1]:1234"),
        _report(1, status="error", reason="RuntimeError: injected error at step 2"),
    ]
    # rank 0 said it failed first (its supervisor won the race): its error is still not the cause
    merged = merge_ranks(rank0, reports, failed=0)
    assert merged.reason == "rank 1 (node 0, GPU 1): RuntimeError: injected error at step 2"


# Through the real Elastic task: each launch starts two rank processes (spawned by PyTorch Elastic), each of
# which supervises a training child; about 20 s per launch on two CPU cores.


def _launch(tmp_path: Path, dataset_dir: Path, model_dir: Path, timeout_s: int = 240, **settings) -> RunResult:
    from flytekit.types.directory import FlyteDirectory

    from tasks.train_ranks import ELASTIC_TRAIN_TASKS

    defaults = dict(backend="plain_loop", parallelism="ddp", max_steps=3, max_seq_length=64)
    args = dataclasses.replace(
        TrainingArgs(), device="cpu", per_device_train_batch_size=2, num_gpus=2, **{**defaults, **settings}
    )
    planned = PlannedRun(condition_id="two-ranks", run_number=0, training_args=args, swept_axes=[])
    output = ELASTIC_TRAIN_TASKS[1, 2](
        planned_run=planned,
        dataset_dir=FlyteDirectory(str(dataset_dir)),
        model_dir=FlyteDirectory(str(model_dir)),
        condition_timeout_s=timeout_s,
        results_store=str(tmp_path / "store"),
        force_fresh=True,
    )
    return output.result


def _leftover_workers(tmp_path: Path) -> list[str]:
    """The processes of this test's run still alive (none may outlive its run): those whose command line names the
    test's directory (a fresh interpreter's) or that hold a file under it open (a forked child holds its log).
    Other tests' runs, in this process's sibling test workers, are not this test's."""
    here = str(tmp_path)
    alive = []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        try:
            text = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            held = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if here in text or any(path.startswith(here) for path in held):
            alive.append(f"{proc.name}: {text}")
    return alive


@pytest.mark.parametrize(
    ("parallelism", "backend"),
    [
        ("ddp", "plain_loop"),
        pytest.param("fsdp", "plain_loop", marks=pytest.mark.slow),
        pytest.param("ddp", "trl_sft", marks=pytest.mark.slow),
        pytest.param("fsdp", "hf_trainer", marks=pytest.mark.slow),
    ],
)
def test_two_ranks_train_one_run_over_gloo(parallelism, backend, tmp_path, tiny_dataset_dir, tiny_model_dir):
    result = _launch(tmp_path, tiny_dataset_dir, tiny_model_dir, parallelism=parallelism, backend=backend)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    assert [(r.rank, r.local_rank, r.status) for r in result.ranks] == [(0, 0, "ok"), (1, 1, "ok")]
    per_rank = [r.tokens_per_second for r in result.ranks]
    # the run's throughput is both ranks' tokens over the slower one's time: at most their rates' sum
    assert min(per_rank) < result.metrics["tokens_per_second"] <= sum(per_rank) * (1 + 1e-9)
    assert result.metrics["tokens_per_second_per_gpu"] == pytest.approx(result.metrics["tokens_per_second"] / 2)
    assert result.metrics["world_size"] == 2
    assert result.steps_file and Path(result.steps_file).exists()
    # each rank's child forked from the server the launching process (this one) offered the node's ranks
    assert result.details["child_started"] == "forked from the fork server"
    assert _leftover_workers(tmp_path) == []


@pytest.mark.parametrize(
    ("arm", "parallelism"),
    [
        pytest.param("cce", "fsdp", marks=pytest.mark.slow),
        pytest.param("cce", "ddp", marks=pytest.mark.slow),
        pytest.param("compile", "ddp", marks=pytest.mark.slow),
        pytest.param("compile", "fsdp", marks=pytest.mark.slow),
        pytest.param("liger-without-loss+cce", "ddp", marks=pytest.mark.slow),
        pytest.param("liger-without-loss+cce", "fsdp", marks=pytest.mark.slow),
        pytest.param("liger+compile", "ddp", marks=pytest.mark.slow),
        pytest.param("liger+compile", "fsdp", marks=pytest.mark.slow),
    ],
)
def test_each_stack_of_the_shoot_out_trains_on_two_ranks(arm, parallelism, tmp_path, tiny_dataset_dir, tiny_model_dir):
    """The stacks but float8 (a run refuses its matmuls on a CPU: tests/running/test_float8.py trains it on two
    ranks) under DDP and FSDP2: Cut Cross-Entropy's loss reads the LM head's weight inside the shared module's
    forward, torch.compile's graphs run under either. Slow (a minute or more each on two cores: the CPU's compiled
    kernels); the default run trains two ranks of the plain model (test_two_ranks_train_one_run_over_gloo)."""
    result = _launch(tmp_path, tiny_dataset_dir, tiny_model_dir, parallelism=parallelism, arm=arm, timeout_s=400)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    assert [r.status for r in result.ranks] == ["ok", "ok"]
    assert result.metrics["tokens_per_second"] > 0
    assert _leftover_workers(tmp_path) == []


def test_a_failing_rank_ends_the_run_as_its_failure_and_stops_the_other(
    tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("FINETUNE_BENCH_FAULT", "oom@2:two-ranks#0@rank1")
    result = _launch(tmp_path, tiny_dataset_dir, tiny_model_dir)
    assert result.status == "oom"
    assert result.reason.startswith("rank 1 (node 0, GPU 1): out of memory at step 3")
    assert "injected at step 2" in result.error_tail
    assert {r.rank: r.status for r in result.ranks}[1] == "oom"
    # rank 0 finished before rank 1's failure reached it, was stopped, or saw its peer go (a gloo error)
    assert {r.rank: r.status for r in result.ranks}[0] in ("ok", "stopped", "error")
    assert _leftover_workers(tmp_path) == []


def test_a_hanging_rank_ends_the_run_as_a_timeout(tmp_path, tiny_dataset_dir, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("FINETUNE_BENCH_FAULT", "hang@1:two-ranks#0@rank1")
    result = _launch(tmp_path, tiny_dataset_dir, tiny_model_dir, timeout_s=30)
    assert result.status == "timeout", f"{result.reason}\n{result.error_tail}"
    assert "no result within the 30 s timeout" in result.reason
    assert _leftover_workers(tmp_path) == []


PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAUNCHES_UNTIL_STOPPED = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from tests.running.test_ranks import _launch

    tmp, dataset, model = (Path(a) for a in sys.argv[1:4])
    for number in range(3):  # a grid's runs, one after the other, as pyflyte run launches them
        print("launch", number, flush=True)
        _launch(tmp / str(number), dataset, model, timeout_s=600)
    """
)


def test_a_signal_during_a_launch_ends_the_process_not_just_the_run(tmp_path, tiny_dataset_dir, tiny_model_dir):
    """SIGTERM (or Ctrl-C) while a run's ranks train ends the launching process, its ranks and their children, as
    it does a one-GPU run's launcher; PyTorch Elastic's agent would have made it one lost run, the grid going on."""
    # every run's files (flytekit's working directory among them) under tmp_path; each rank hangs after its step 1
    env = dict(os.environ, FINETUNE_BENCH_FAULT="hang@2", PYTHONPATH=str(PROJECT_ROOT), TMPDIR=str(tmp_path))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHES_UNTIL_STOPPED, str(tmp_path), str(tiny_dataset_dir), str(tiny_model_dir)],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout.readline().strip() == "launch 0"
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("**/steps.csv")) and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the first step's row: the ranks' children are training (and hang at step 1)
        assert launcher.poll() is None and time.monotonic() < deadline, "the ranks never trained"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        assert "launch 1" not in launcher.stdout.read()
        assert _leftover_workers(tmp_path) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
