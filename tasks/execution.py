"""Where a task runs: in a cluster's pod, or in a local `pyflyte run`; and what a cluster run leaves behind that a
local one does not."""

from flytekit.core.context_manager import FlyteContextManager

from finetune_bench.inputs.catalog import FILE_URL
from tasks.registration import WANDB_ENTITY, wandb_disabled

NO_RESULTS_STORE = (
    "results_store is empty: each finished run is kept on its train pod's disk, which goes with the pod, so a later "
    "execution can neither resume this grid nor reuse its runs. Set results_store to a bucket URL the pods can write "
    "(s3://..., gs://..., abfs://...) for that."
)
# The same of a local path (`/data/results`, `./runs/.results`, `file://...`): on a cluster it is a directory on each
# train pod's own disk unless it is a volume mounted in every pod.
LOCAL_RESULTS_STORE = (
    "results_store {store!r} is a local path: on a cluster each train pod writes it on its own disk (unless it is a "
    "volume mounted in every pod), which goes with the pod, so a later execution can neither resume this grid nor "
    "reuse its runs. Set results_store to a bucket URL the pods can write (s3://..., gs://..., abfs://...) for that."
)
NO_WANDB = (
    "WANDB_ENTITY was not set when the workflow was registered: the runs are not logged to Weights & Biases "
    "(see docs/cluster.md)."
)


def on_cluster() -> bool:
    """True in a cluster's pod (flytekit runs the task from its container command), False in a local run."""
    state = FlyteContextManager.current_context().execution_state
    return state is not None and state.mode is not None and not state.is_local_execution()


def cluster_notes(results_store: str) -> list[str]:
    """What this cluster execution will not keep, said in the plan and in the report (none locally, where
    the default results store and offline W&B runs stay on this machine)."""
    if not on_cluster():
        return []
    notes = [store_note(results_store)] if store_note(results_store) else []
    if not WANDB_ENTITY and not wandb_disabled():
        notes.append(NO_WANDB)
    return notes


def store_note(results_store: str) -> str:
    """What a cluster execution will not keep of its runs in `results_store`: an empty one or a local path is each
    train pod's own disk ("" for a URL of an object store, which every pod reaches)."""
    if not results_store:
        return NO_RESULTS_STORE
    if "://" not in results_store or results_store.startswith(FILE_URL):
        return LOCAL_RESULTS_STORE.format(store=results_store)
    return ""
