"""A memory-frontier search on several GPUs: every probe is one run over every rank of a PyTorch Elastic launch.

Each rank of the launch (one per GPU, on every node) runs `search_on_ranks`. Global rank 0 runs the search
(`frontier.search.search_frontier`, guided by the memory model where it can be): for each probe it posts the probe's
settings in the launch's key-value store (`probe/<n>`), then trains its own rank of it. Every other rank waits for
the next probe's settings, trains its rank of that probe, and waits again, until rank 0 posts that the search is done.

A probe runs as a benchmark run on several GPUs does (`running.ranks.run_on_ranks`, under a store namespace of its
own): each rank supervises a fresh training child; a rank whose child runs out of memory (or fails otherwise) says
so first, and every other rank kills its own child at once, so that no rank waits in a collective for a dead peer
until the process group's timeout; rank 0 makes the probe's outcome of every rank's report (the rank that failed
first, the memory phase it ran out in, its peak). A probe is never looked up in or saved to the results store: the
searches always measure.
"""

import dataclasses
import functools
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

from finetune_bench.frontier.probes import probe_outcome, probe_run
from finetune_bench.frontier.search import FrontierResult, Guide, ProbeOutcome, search_frontier
from finetune_bench.frontier.settings import FrontierSearch
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.ranks import RankPlace, launch_store, run_on_ranks, wait_for_key

# The launch store's namespace of the searches' keys, and rank 0's word that no probe follows.
NAMESPACE = "frontier/"
DONE = "done"
# How long a rank waits for rank 0's next probe beyond a probe's timeout (rank 0 decides in milliseconds; the first
# probe waits for the model and data to be fetched).
_NEXT_PROBE_GRACE_S = 600.0


def search_on_ranks(
    search: FrontierSearch,
    fetch_sources: Callable[[], tuple[Path, Path]],
    work_dir: Path,
    guide: Callable[[Path], Guide | None] = lambda model_dir: None,
) -> FrontierResult | None:
    """This rank's part of `search`: the search's result on global rank 0, None on every other rank.
    `fetch_sources()` gives the local dataset and model directories (each node's first rank calls it, once);
    `guide(model_dir)` the memory model's guide of the search (rank 0 asks it once; None: an unguided search)."""
    place = RankPlace.from_env()
    store = launch_store(search.timeout_s + _NEXT_PROBE_GRACE_S, NAMESPACE)
    fetch = functools.cache(fetch_sources)
    if place.rank != 0:
        _follow(search, store, fetch, Path(work_dir))
        return None
    numbers = itertools.count()

    def probe(training_args: TrainingArgs) -> ProbeOutcome:
        number = next(numbers)
        store.set(f"probe/{number}", json.dumps(dataclasses.asdict(training_args)))
        result = _probe_on_ranks(search, training_args, number, fetch, Path(work_dir))
        return probe_outcome(result)

    try:
        return search_frontier(search, probe, guide(fetch()[1]))
    finally:  # however the search ended, the other ranks stop waiting for a probe
        store.set(f"probe/{next(numbers)}", DONE)


def _follow(search: FrontierSearch, store: "torch.distributed.Store", fetch: Callable, work_dir: Path) -> None:  # noqa: F821
    """A rank other than 0: train its rank of each probe rank 0 posts, until rank 0 says the search is done."""
    for number in itertools.count():
        deadline = time.monotonic() + search.timeout_s + _NEXT_PROBE_GRACE_S
        posted = wait_for_key(store, f"probe/{number}", deadline)
        if posted == DONE:
            return
        _probe_on_ranks(search, TrainingArgs(**json.loads(posted)), number, fetch, work_dir)


def _probe_on_ranks(
    search: FrontierSearch, training_args: TrainingArgs, number: int, fetch: Callable, work_dir: Path
) -> "RunResult | None":  # noqa: F821
    """This rank's part of probe `number` (its result on rank 0): always trained, never stored."""
    return run_on_ranks(
        probe_run(training_args, number),
        None,
        fetch,
        work_dir / f"probe-{number:03d}",
        search.timeout_s,
        force_fresh=True,
        namespace=f"probe/{number}/",
    )
