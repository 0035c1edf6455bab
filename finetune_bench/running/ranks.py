"""One run on several GPUs: what each rank of a PyTorch Elastic launch does, and how the ranks' ends make the run's.

PyTorch Elastic (through flytekitplugins-kfpytorch's `Elastic` task, `tasks.train`) starts one process per GPU on
every node. Each of them runs `run_on_ranks`: it supervises one training child (`running.worker`, the same child
a one-GPU run trains in, here one rank of the process group) exactly as `launch.run_in_child` does, with the
same timeout, the same classification of its end and nothing left behind. The ranks talk through the launch's
own key-value store (the elastic agent's TCPStore, at MASTER_ADDR:MASTER_PORT):

- each node's first rank takes the machine's device lock and fetches the model and data once for its node;
- global rank 0 looks the run up in the results store and tells every rank to train or not;
- a rank whose child fails (out of memory, an error, a timeout, a crash) says so first, and every other rank
  kills its own child at once: a peer left waiting in a collective would otherwise hang until its timeout;
- each rank files a summary of its end; rank 0 makes the run's result of them (the failing rank's status and
  reason, named; throughput summed over ranks; memory per rank, its maximum and spread), stores it and returns it.

Each rank's child forks from the fork server the launching process offers the node's ranks (`node_fork_server`,
`running.forkserver.offered_to_ranks`), as a one-GPU run's does, or starts as a fresh interpreter where it cannot.

The supervisors never raise for the run's own failure, so the elastic agent always sees them succeed and the
grid's other conditions run on.
"""

import contextlib
import dataclasses
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.measuring.metrics import (
    ENERGY_UNAVAILABLE,
    MAX,
    MEASURED_TIME,
    METRICS,
    RANK0,
    TIME_BASES,
    TOTALS,
    throughput,
)
from finetune_bench.results.record import ERROR, NONFINITE, OK, OOM, STOPPED, TIMEOUT, RankSummary, RunResult
from finetune_bench.results.store import ResultStore, hardware_fingerprint, identity_key, run_identity
from finetune_bench.running import forkserver
from finetune_bench.running.device_lock import device_lock
from finetune_bench.running.faults import switches_on
from finetune_bench.running.launch import child_env, not_launched, reuse_line, run_child, save_result, stored_result

logger = logging.getLogger(__name__)

# Keys of this launch's store, under one prefix so that they never meet the process group's own.
_PREFIX = "finetune_bench/"
# How long a rank waits for another to file its summary once its own child has ended: the others end within
# the kill grace of the first failure, or at their own timeout (which started within seconds of this one's).
_SUMMARY_GRACE_S = 120.0
# The reason of a rank whose supervisor filed no report.
_NO_REPORT = "its supervisor filed no result"
# The details key naming the rank whose failure is the run's (`merge_ranks`).
FAILED_RANK = "failed_rank"
# How often a supervisor checks whether another rank failed.
POLL_S = 1.0
# How often a rank looks for a key another rank sets. It looks rather than waiting on the store: each store wait
# that times out makes torch's C++ store client print two warnings on stderr.
_CHECK_S = 0.05


@dataclass(frozen=True)
class RankPlace:
    """Where this process sits in the launch, from the environment PyTorch Elastic gives each rank."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int

    @classmethod
    def from_env(cls) -> "RankPlace":
        names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
        missing = [name for name in names if name not in os.environ]
        if missing:
            raise RuntimeError(f"not a rank of a PyTorch Elastic launch: {', '.join(missing)} not set")
        return cls(*(int(os.environ[name]) for name in names))

    def __str__(self) -> str:
        return f"rank {self.rank} (node {self.node_rank}, GPU {self.local_rank})"


def launch_store(timeout_s: float, namespace: str = "") -> "torch.distributed.Store":  # noqa: F821
    """A client of the launch's key-value store (hosted by the elastic agent), keys under this module's prefix and
    `namespace` (each of several runs in one launch, a memory-frontier search's probes, has its own)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return dist.PrefixStore(_PREFIX + namespace, store)


class RanksStopped(Exception):
    """The ranks could not start training together: a rank failed before it (or waited too long for its peers)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def wait_for_key(store: "torch.distributed.Store", key: str, deadline: float) -> str:  # noqa: F821
    """The value of `key` once some rank has set it. Raises RanksStopped when a rank said it cannot go on (the
    `abort` key), or when the monotonic clock passes `deadline` (a peer gone without a word)."""
    while True:
        if store.check([key]):
            return store.get(key).decode()
        if store.check(["abort"]):
            raise RanksStopped(**json.loads(store.get("abort").decode()))
        if time.monotonic() >= deadline:
            raise RanksStopped(TIMEOUT, f"waited longer than the run's timeout for its peers ({key} never came)")
        time.sleep(_CHECK_S)


def _failed_rank(store: "torch.distributed.Store") -> int | None:  # noqa: F821
    return int(store.get("failed").decode()) if store.check(["failed"]) else None


@dataclass
class RankReport:
    """What a rank files for rank 0: its summary, the totals its rates come from, its error's tail, and its own
    figures of the `MAX` metrics its summary has no field for (the timeline's phases)."""

    summary: RankSummary
    totals: dict[str, float]
    error_tail: str = ""
    maxima: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RankReport":
        data = json.loads(text)
        return cls(
            summary=RankSummary(**data["summary"]),
            totals=data["totals"],
            error_tail=data["error_tail"],
            maxima=data["maxima"],
        )


@contextlib.contextmanager
def node_fork_server(run: PlannedRun) -> Iterator[None]:
    """In the process that launches `run`'s ranks on this node, around the launch: offer the ranks a fork server
    for their training children (started now, its imports overlapping the ranks' start; kept for the next launch).
    Nothing is offered for a run that launches nothing."""
    if run.refused or run.predicted_oom or not forkserver.enabled():
        yield
        return
    try:
        env = child_env(run, quiet=True)
    except SpecError:  # a software set that cannot be installed here: each rank's run says so (`run_child`)
        yield
        return
    with forkserver.offered_to_ranks(env):
        yield


def run_on_ranks(
    run: PlannedRun,
    results_store: ResultStore | None,
    fetch_sources: Callable[[], tuple[Path, Path]],
    work_dir: Path,
    timeout_s: float,
    force_fresh: bool = False,
    sources: dict[str, str] | None = None,
    namespace: str = "",
) -> RunResult | None:
    """This rank's part of `run`: the run's result on global rank 0, None on every other rank.

    `fetch_sources()` gives the local dataset and model directories (called once per node, by its first rank).
    `results_store` None: the run is always trained and never stored (a memory-frontier probe). `namespace`: the
    launch store's keys of this run, where one launch runs several (`launch_store`).
    """
    place = RankPlace.from_env()
    if run.refused or run.predicted_oom:  # nothing to launch
        return not_launched(run) if place.rank == 0 else None
    store = launch_store(timeout_s + _SUMMARY_GRACE_S, namespace)
    switches = switches_on(run.name, place.world_size)
    if switches:  # a test-only switch makes no measurement: the store is neither read nor written
        results_store = None
    hardware = hardware_fingerprint()
    identity = run_identity(run, hardware, sources or {})
    key = identity_key(identity)
    name = f"{run.condition_id} run {run.run_number}"
    # A peer that has not come by then (its node could not start, or died) stops the run as a timeout.
    deadline = time.monotonic() + timeout_s
    with contextlib.ExitStack() as held:
        try:
            if place.local_rank == 0:
                waited_s = held.enter_context(device_lock(hardware))
                dataset_dir, model_dir = fetch_sources()
                store.set(f"sources/{place.node_rank}", json.dumps([str(dataset_dir), str(model_dir), waited_s]))
            dataset_dir, model_dir, waited_s = json.loads(wait_for_key(store, f"sources/{place.node_rank}", deadline))
            problems, notes, store_s = [], {}, None
            if place.rank == 0:
                for node in range(place.world_size // place.local_world_size):
                    wait_for_key(store, f"sources/{node}", deadline)
                stored = None
                if not force_fresh and results_store is not None:
                    looked_up = time.perf_counter()
                    stored, problems, notes = stored_result(results_store, key, work_dir, name, run, identity)
                    store_s = time.perf_counter() - looked_up
                store.set("decision", "reuse" if stored is not None else "train")
                if stored is not None:
                    logger.warning("%s: %s", name, reuse_line(stored, key))
                    stored.reused = True
                    return stored
            elif wait_for_key(store, "decision", deadline) == "reuse":
                return None
        except Exception as exc:  # before any training: every rank stops, rank 0 says why
            return _stopped_before_training(run, place, store, exc)
        report, result = _train_rank(
            run, place, store, Path(dataset_dir), Path(model_dir), work_dir, timeout_s, namespace
        )
        store.set(f"report/{place.rank}", report.to_json())
        if place.rank != 0:
            return None
        merged = merge_ranks(result, _gather_reports(store, place.world_size, report), _failed_rank(store))
        merged.details.update(notes)
        if waited_s >= 1:
            merged.details["waited_for_device_s"] = f"{waited_s:.0f}"
        if store_s is not None:  # rank 0's lookup
            merged.metrics["store_s"] = store_s
        merged.problems.extend(problems)
        if results_store is not None:
            merged.problems.extend(save_result(results_store, key, merged, identity, name))
        if switches:
            merged.details["test_switches"] = ", ".join(switches)
        merged.predicted_peak_reserved_bytes = run.predicted_peak_reserved_bytes
        merged.predicted_moment_allocated_bytes = dict(run.predicted_moment_allocated_bytes)
        return merged


def _stopped_before_training(
    run: PlannedRun,
    place: RankPlace,
    store: "torch.distributed.Store",  # noqa: F821
    exc: Exception,
) -> RunResult | None:
    """Tell the other ranks that this one cannot go on (unless one already did), and on rank 0 end the run with
    the first reason given: an error, or a timeout waiting for peers."""
    if isinstance(exc, RanksStopped):
        status, reason = exc.status, exc.reason
    else:
        status, reason = ERROR, f"{place} could not start: {type(exc).__name__}: {_first_line(exc)}"
        logger.error("%s", reason)
    try:
        store.compare_set("abort", "", json.dumps({"status": status, "reason": reason}))
        first = json.loads(store.get("abort").decode())
        status, reason = first["status"], first["reason"]
    except Exception as store_gone:  # the launch's store is gone with its node: this rank's reason stands
        logger.error("%s: the launch's store is unreachable (%s)", place, store_gone)
    if place.rank != 0:
        return None
    result = not_launched(run)
    result.status, result.reason = status, reason
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _train_rank(
    run: PlannedRun,
    place: RankPlace,
    store: "torch.distributed.Store",  # noqa: F821
    dataset_dir: Path,
    model_dir: Path,
    work_dir: Path,
    timeout_s: float,
    namespace: str = "",
) -> tuple[RankReport, RunResult]:
    """Train this rank in its child, killed as soon as another rank failed: its report and its own result."""

    def another_failed() -> str:
        failed = _failed_rank(store)
        return f"rank {failed} failed first" if failed is not None and failed != place.rank else ""

    result = run_child(
        run, dataset_dir, model_dir, work_dir, timeout_s, rank=place.rank, stop_when=another_failed, poll_s=POLL_S,
        process_group_namespace=namespace,
    )  # fmt: skip
    if result.status not in (OK, STOPPED):
        store.compare_set("failed", "", str(place.rank))  # written only where no rank has yet: the first failure
    metrics = result.metrics
    summary = RankSummary(
        rank=place.rank,
        node_rank=place.node_rank,
        local_rank=place.local_rank,
        host=socket.gethostname(),
        status=result.status,
        reason=result.reason,
        tokens_per_second=metrics.get("tokens_per_second"),
        peak_allocated_bytes=metrics.get("peak_allocated_bytes"),
        peak_reserved_bytes=metrics.get("peak_reserved_bytes"),
        nvml_peak_bytes=metrics.get("nvml_process_peak_bytes", metrics.get("nvml_device_used_peak_bytes")),
    )
    totals = {name: metrics[name] for name in TOTALS if name in metrics}
    maxima = {name: metrics[name] for name in _MAXIMA if name in metrics}
    error_tail = result.error_tail if result.status not in (OK, STOPPED) else ""
    return RankReport(summary, totals, error_tail, maxima), result


def _gather_reports(store: "torch.distributed.Store", world_size: int, own: RankReport) -> list[RankReport]:  # noqa: F821
    """Every rank's report, by rank; a rank that filed none within the grace period is an error."""
    reports = {own.summary.rank: own}
    deadline = time.monotonic() + _SUMMARY_GRACE_S
    for rank in range(world_size):
        if rank in reports:
            continue
        try:
            store.wait([f"report/{rank}"], timedelta(seconds=max(deadline - time.monotonic(), 0.1)))
            reports[rank] = RankReport.from_json(store.get(f"report/{rank}").decode())
        except RuntimeError:  # its supervisor died, or hangs: the elastic agent reports it; the run is an error
            reason = f"{_NO_REPORT} within {_SUMMARY_GRACE_S:g} s of rank 0's end"
            reports[rank] = RankReport(RankSummary(rank, -1, -1, "", ERROR, reason), {})
    return [reports[rank] for rank in range(world_size)]


# The rank summary's field of each per-rank peak (`MAX` in the metrics table) where its name is not the metric's.
_SUMMARY_FIELD = {"nvml_rank_peak_bytes": "nvml_peak_bytes"}
_SUMMARY_FIELDS = {field.name for field in dataclasses.fields(RankSummary)}
# The `MAX` metrics a rank files in its report's `maxima` (its summary has no field for them).
_MAXIMA = tuple(
    m.name for m in METRICS.values() if m.ranks == MAX and _SUMMARY_FIELD.get(m.name, m.name) not in _SUMMARY_FIELDS
)


def rank_figure(report: RankReport, metric: str) -> float | None:
    """What the rank of `report` filed of the `MAX` metric `metric` (None: nothing)."""
    if metric in _MAXIMA:
        return report.maxima.get(metric)
    return getattr(report.summary, _SUMMARY_FIELD.get(metric, metric))


def merge_ranks(rank0: RunResult, reports: list[RankReport], failed: int | None) -> RunResult:
    """The run's result from rank 0's own and every rank's report: the first failing rank's status, reason and
    error (named); the throughput of all ranks together (their tokens over the slowest rank's measured time),
    per GPU, and the model FLOPs utilization over all GPUs; the GPU energy of all ranks together (per token: over
    all their tokens; none when a rank has none, said in the details); each memory peak as the largest rank's,
    with its spread over the ranks. Step times, losses and the held-out loss are rank 0's."""
    merged = dataclasses.replace(
        rank0,
        metrics=dict(rank0.metrics),
        details=dict(rank0.details),
        ranks=[report.summary for report in reports],
        problems=list(rank0.problems),
    )
    culprit = _culprit(reports, failed)
    if culprit is not None:
        summary = culprit.summary
        merged.status = summary.status if summary.status != STOPPED else ERROR
        merged.reason = f"rank {summary.rank} (node {summary.node_rank}, GPU {summary.local_rank}): {summary.reason}"
        merged.details[FAILED_RANK] = str(summary.rank)
        merged.error_tail = culprit.error_tail or rank0.error_tail
    for metric in METRICS.values():  # one rank's view: the combined figures (or none) stand for the run
        if metric.ranks not in (RANK0, MAX):
            merged.metrics.pop(metric.name, None)
    merged.metrics.update(combined_metrics(reports, rank0.environment.get("gpu_name", "")))
    without_energy = [r.summary.rank for r in reports if "measured_energy_j" not in r.totals]
    measured = all(MEASURED_TIME in r.totals for r in reports)
    if measured and without_energy and not merged.details.get(ENERGY_UNAVAILABLE):  # rank 0's own reason stands
        ranks = ", ".join(str(rank) for rank in without_energy)
        merged.details[ENERGY_UNAVAILABLE] = f"rank {ranks} measured no GPU energy (see that rank's log)"
    return merged


# A rank's error that is its peers' failure seen through a collective (a closed connection, an aborted
# communicator): never the cause of the run's failure when another rank has one of its own.
_COLLECTIVE_ERROR = re.compile(
    r"gloo|nccl|ProcessGroup|DistBackendError|DistNetworkError|Connection (closed|reset)|Broken pipe", re.IGNORECASE
)


def _culprit(reports: list[RankReport], failed: int | None) -> RankReport | None:
    """The rank whose failure is the run's: the first of an out-of-memory or non-finite loss, else an error of
    its own, else a timeout, else an error seen through a collective, else a rank that filed no result; among
    equals, the rank that said it failed first (`failed`), then the lowest rank. None when every rank ended ok."""
    failures = [r for r in reports if r.summary.status not in (OK, STOPPED)]
    if not failures:
        return None

    def cause_rank(report: RankReport) -> tuple[int, bool, int]:
        status, reason = report.summary.status, report.summary.reason
        last_line = report.error_tail.rstrip().rsplit("\n", 1)[-1]
        if status in (OOM, NONFINITE):
            kind = 0
        elif reason.startswith(_NO_REPORT):
            kind = 4
        elif status == TIMEOUT:
            kind = 2
        elif _COLLECTIVE_ERROR.search(reason) or _COLLECTIVE_ERROR.search(last_line):
            kind = 3
        else:
            kind = 1
        return kind, report.summary.rank != failed, report.summary.rank

    return min(failures, key=cause_rank)


def combined_metrics(reports: list[RankReport], gpu_name: str) -> dict[str, float]:
    """The run's throughput and memory from its ranks' reports (what every rank measured; nothing when one did
    not)."""
    from finetune_bench.measuring.flops import mfu

    out: dict[str, float] = {"world_size": float(len(reports))}
    totals = [report.totals for report in reports]
    if all(MEASURED_TIME in t for t in totals):
        # the tokens, FLOPs and energy summed; each time base the slowest rank's
        summed = {
            name: (max if name in TIME_BASES else sum)(t[name] for t in totals)
            for name in TOTALS
            if all(name in t for t in totals)
        }
        out.update(throughput(summed, summed[MEASURED_TIME]))
        if "tokens_per_second" in out:
            out["tokens_per_second_per_gpu"] = out["tokens_per_second"] / len(reports)
        if "achieved_tflops" in out:
            utilization = mfu(out["achieved_tflops"] / len(reports), gpu_name)  # each GPU's share of its peak
            if utilization is not None:
                out["mfu"] = utilization
    for metric in (m for m in METRICS.values() if m.ranks == MAX):
        values = [rank_figure(report, metric.name) for report in reports]
        if values and all(v is not None for v in values):
            out[metric.name] = float(max(values))
            if f"{metric.name}_spread" in METRICS:  # a memory peak's spread over the ranks
                out[f"{metric.name}_spread"] = float(max(values) - min(values))
    return out
