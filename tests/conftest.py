"""Keep every test's side effects (Flyte sandboxes and local cache, model/data cache) in one temp tree."""

import atexit
import importlib
import os
import shutil
import tempfile
from pathlib import Path

# Before anything imports flytekit: its local cache lives under ~/.flyte, its sandboxes under TMPDIR. Each process
# (pytest's, and each xdist worker, which inherits the first one's TMPDIR) makes its tree under the system's temp
# directory, never inside another's: nested, the paths outgrow what a Unix socket takes (Chromium's, 108 bytes).
_BASE = os.environ.setdefault("FINETUNE_BENCH_TESTS_BASE_TMP", tempfile.gettempdir())
_ROOT = Path(tempfile.mkdtemp(prefix="finetune-bench-tests-", dir=_BASE))
# The tree goes with the process that made it (a suite's trees held hundreds of megabytes each, and every run left its
# own behind).
atexit.register(shutil.rmtree, _ROOT, True)
for name in ("home", "tmp", "cache"):
    (_ROOT / name).mkdir()
os.environ["HOME"] = str(_ROOT / "home")
os.environ["TMPDIR"] = str(_ROOT / "tmp")
os.environ["FINETUNE_BENCH_CACHE_DIR"] = str(_ROOT / "cache")
os.environ.setdefault("FINETUNE_BENCH_IMAGE_BUILDER", "default")
# pyflyte refuses to run, even locally, without a config once `union` is installed (read at import).
os.environ.setdefault("FLYTECTL_CONFIG", str(Path(__file__).resolve().parent.parent / "flyte-local.yaml"))
os.environ.pop("FINETUNE_BENCH_FAULT", None)
# No W&B server here: tests that plant a fake key must not make every run wait for W&B to time out.
os.environ["WANDB_MODE"] = "offline"
# torch.compile (the cce criterion's CPU implementation, the float16 loss check) compiles its kernels in this process
# and the training children: with more than one compile thread inductor first starts a pool of compile processes,
# each importing torch, which on two cores shared with another test worker costs more than it saves.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# One thread per process for PyTorch's (OpenMP's) operators: the suite's workers and their training children share two
# cores and train tiny models, and a pool of threads per process spins waiting for cores the others hold.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# joblib sets this in its importer's environment (scikit-learn imports it): in a test worker that is halfway through
# its tests, whenever one first imports scikit-learn, and every run after it then needs a fork server of its own
# (keyed by the environment, seconds of both cores to start). Set from the start, as joblib sets it.
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")
tempfile.tempdir = None

import contextlib  # noqa: E402

import pytest  # noqa: E402

# pytest sets PYTEST_CURRENT_TEST to the test's id and phase before each setup and call. A training child's
# environment is this process's, and the fork server a child is forked from is keyed by that environment
# (finetune_bench.running.forkserver.server_key): with the variable in it, every test (and every fixture
# setting up) would start a fork server of its own and wait ~5 s for its imports, where a user's grid
# starts one. While a test function or a fixture runs, the variable is out of the environment.
_CURRENT_TEST_ENV = "PYTEST_CURRENT_TEST"


@contextlib.contextmanager
def _without_current_test_var():
    value = os.environ.pop(_CURRENT_TEST_ENV, None)
    try:
        yield
    finally:
        if value is not None:
            os.environ[_CURRENT_TEST_ENV] = value


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    with _without_current_test_var():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with _without_current_test_var():
        return (yield)


# The files that take longest with the whole suite running on two cores (each a minute or more: training runs,
# `pyflyte run`, pods), longest first. Each file runs whole on one worker (`--dist loadfile`), and the workers take
# files in the order collected (`--no-loadscope-reorder`): these first, so that none of them starts while the others
# end, then every other file as collected. A file missing here only runs later; a renamed one is still run.
LONGEST_FILES = (
    "cluster/test_cluster_path.py",
    "running/test_ranks.py",
    "workflows/test_workflow.py",
    "running/test_faults_resume.py",
    "running/test_forkserver.py",
    "running/test_launch.py",
    "kernels/test_kernels.py",
    "frontier/test_frontier.py",
    "running/test_float8.py",
    "running/test_float16_mixed_precision.py",
    "integrations/test_wandb_logging.py",
    "reporting/test_figure_layout.py",
    "running/test_evaluation.py",
    "analysis/test_stacks.py",
    "frontier/test_frontier_ranks.py",
    "running/test_hand_loop.py",
    "running/test_process_cleanup.py",
    "running/test_device_lock.py",
    "running/test_attention_and_allocator.py",
    "sources/test_software.py",
    "running/test_backends_extra.py",
    "running/test_cut_cross_entropy_loss.py",
    "workflows/test_nothing_lost.py",
    "running/test_profile.py",
)


def pytest_collection_modifyitems(session, config, items):
    tests = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def file_rank(item) -> int:
        try:
            return rank.get(item.path.resolve().relative_to(tests).as_posix(), len(rank))
        except ValueError:  # a test outside tests/
            return len(rank)

    items.sort(key=file_rank)  # stable: each file's own tests keep their order


@pytest.fixture(scope="session")
def test_root() -> Path:
    return _ROOT


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from finetune_bench.sources.models import prepare_model

    return prepare_model("random:tiny-llama")


@pytest.fixture(scope="session")
def tiny_dataset_dir() -> Path:
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.sources.datasets import DatasetSource, prepare_dataset

    return prepare_dataset(DatasetSource.of(TrainingArgs(synthetic_num_examples=64)))


# Where Liger's patch functions for the architectures the tests build write: module globals (classes,
# functions) and class attributes (a causal LM's forward).
_LIGER_PATCHED_MODULES = ("transformers.models.llama.modeling_llama", "torch.nn.functional")


def _snapshot(module) -> dict:
    state = {"": dict(vars(module))}
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == module.__name__:
            state[value.__qualname__] = (value, dict(vars(value)))
    return state


def _restore(module, state: dict) -> None:
    before = state.pop("")
    for name in set(vars(module)) - set(before):
        delattr(module, name)
    for name, value in before.items():
        if vars(module).get(name) is not value:
            setattr(module, name, value)
    for cls, attributes in state.values():
        for name in set(vars(cls)) - set(attributes):
            delattr(cls, name)
        for name, value in attributes.items():
            if name not in ("__dict__", "__weakref__") and vars(cls).get(name) is not value:
                setattr(cls, name, value)


@pytest.fixture
def undo_liger_patches():
    """Put back what Liger patched module-wide in this process (its patches outlive the model they were
    applied to), so that a later test's model is vanilla. For tests that apply Liger in-process."""
    modules = [importlib.import_module(name) for name in _LIGER_PATCHED_MODULES]
    states = [_snapshot(module) for module in modules]
    yield
    for module, state in zip(modules, states, strict=True):
        _restore(module, state)


@pytest.fixture(autouse=True)
def _no_frozen_objects_left():
    """A test that began a StepRecorder's training without ending it leaves the collector's objects frozen
    (gc.freeze); the next test starts without."""
    yield
    import gc

    gc.unfreeze()
