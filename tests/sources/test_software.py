"""Software sets (finetune_bench.sources.software): pins refused at once with why, a set installed once into an
overlay its runs import first, checked at planning against the package index and the installed packages, and a run
that imports the releases its set names (or ends as an error saying what it found)."""

import dataclasses
import importlib.metadata as md
import json

import pytest

from finetune_bench.inputs import software_sets
from finetune_bench.inputs.errors import ConditionRefused, SpecError
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.results.store import run_identity
from finetune_bench.running import forkserver
from finetune_bench.running.launch import run_in_child
from finetune_bench.sources import software

# A release of liger-kernel older than the installed one that the project still runs (its requirement: >=0.8).
OLDER_LIGER = "0.8.2"


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own (software sets are built anew) and no set prepared in this process yet."""
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    software.prepare.cache_clear()
    software.conflicts.cache_clear()
    yield tmp_path / "cache"
    software.prepare.cache_clear()
    software.conflicts.cache_clear()


def test_every_problem_of_a_set_is_named_at_once():
    with pytest.raises(SpecError) as caught:
        TrainingArgs.from_mapping(
            {"software_set": "torch==2.4, nvidia-nccl-cu12==2.1, foo==1, liger-kernel=0.8, trl==x"}
        )
    problems = caught.value.problems
    assert len(problems) == 5, problems
    assert "torch cannot be pinned in a set: its build is made for the GPU's driver" in problems[0]
    assert "nvidia-nccl-cu12 cannot be pinned" in problems[1]
    assert "foo is not a package a set can pin; it can pin liger-kernel" in problems[2]
    assert "'liger-kernel=0.8' is not a pin; write package==version" in problems[3]
    assert "'x' is not a version of trl" in problems[4]


def test_two_spellings_of_one_set_are_one_set():
    assert software_sets.canonical(" trl==1.16.0 , Liger_Kernel==0.8.2") == "liger-kernel==0.8.2,trl==1.16.0"
    with pytest.raises(SpecError, match="'liger-kernel==0.8.2' and 'liger_kernel == 0.8.2' are the same set"):
        ExperimentArgs.from_mapping({"software_set": ["liger-kernel==0.8.2", "liger_kernel == 0.8.2", ""]})


def test_versions_are_compared_as_pep_440_normalizes_them():
    assert software_sets.canonical("liger-kernel==v0.8.2") == software_sets.canonical("liger-kernel==0.8.2")
    with pytest.raises(SpecError, match="'liger-kernel==0.8.2' and 'liger-kernel==v0.8.2' are the same set"):
        ExperimentArgs.from_mapping({"software_set": ["liger-kernel==0.8.2", "liger-kernel==v0.8.2"]})


def test_a_set_of_the_installed_releases_beside_the_installed_set_is_refused(own_cache):
    """Beside '', a set pinning what is installed would compare a release with itself."""
    installed = md.version("liger-kernel")
    with pytest.raises(SpecError, match=rf"'liger-kernel=={installed}' pins the releases installed here"):
        software.check_all(["", f"liger-kernel=={installed}"], "experiment_args.software_set")
    software.check_all([f"liger-kernel=={installed}"], "training_args.software_set")  # alone: the installed set


def test_a_pin_of_the_installed_release_needs_no_overlay(own_cache):
    installed = md.version("liger-kernel")
    assert software.prepare(f"liger-kernel=={installed}") == software.PreparedSet({"liger-kernel": installed}, None)
    env = {"PYTHONPATH": "/x"}
    software.apply(env, f"liger-kernel=={installed}")
    assert env == {"PYTHONPATH": "/x"}
    assert not own_cache.exists()  # nothing built


def test_planning_refuses_a_release_that_does_not_exist_in_one_line(own_cache):
    with pytest.raises(SpecError) as caught:
        grid = ExperimentArgs(arm=["liger", "baseline"], software_set=["", "liger-kernel==9.9.9"])
        software.checked_runs(plan_runs(grid, TrainingArgs(), 1), swept=True)
    (problem,) = caught.value.problems  # said once for the grid, not once per condition
    assert problem.startswith("experiment_args.software_set 'liger-kernel==9.9.9': uv could not install")
    assert "no version of liger-kernel==9.9.9" in problem
    assert "\n" not in problem


def test_planning_refuses_a_set_at_odds_with_the_installed_packages(own_cache):
    """liger-kernel 0.6.0 installs, but the project needs 0.8 or newer: pip's own check says so, one line a problem."""
    with pytest.raises(SpecError) as caught:
        software.checked_runs(plan_runs(ExperimentArgs(software_set=["liger-kernel==0.6.0"]), TrainingArgs(), 1), True)
    assert caught.value.problems == [
        "experiment_args.software_set 'liger-kernel==0.6.0' does not hold together with the installed packages: "
        "finetune-bench 0.1.0 has requirement liger-kernel>=0.8, but you have liger-kernel 0.6.0."
    ]


def test_a_kernel_the_pinned_release_lacks_is_refused_with_why(own_cache):
    """Liger 0.2.0 had no fused linear cross entropy for Gemma 2: what an arm needs is read from the release's own
    source, and only that condition is refused."""
    t = TrainingArgs(model_name="random:tiny-gemma2", arm="liger:fused_linear_cross_entropy")
    runs = [PlannedRun(f"s={s}", 0, dataclasses.replace(t, software_set=s), []) for s in ("liger-kernel==0.2.0", "")]
    software.conflicts.cache_clear()
    software.prepare("liger-kernel==0.2.0")
    # (0.2.0 is also at odds with the project's liger-kernel>=0.8: the refusal of the kernel is checked alone here)
    software._check_release_has_what_the_arm_needs(runs[1])
    with pytest.raises(ConditionRefused, match=r"liger-kernel 0.2.0 has no 'fused_linear_cross_entropy' kernel for "):
        software._check_release_has_what_the_arm_needs(runs[0])


def test_a_run_s_store_identity_holds_its_set_s_releases():
    run = PlannedRun("c", 0, TrainingArgs(software_set=f"liger-kernel=={OLDER_LIGER}"), [])
    installed = PlannedRun("c", 0, TrainingArgs(), [])
    assert run_identity(run, "cpu")["software"]["liger-kernel"] == OLDER_LIGER
    assert run_identity(installed, "cpu")["software"]["liger-kernel"] == md.version("liger-kernel")


def test_a_run_that_would_import_another_release_than_its_set_names_fails():
    with pytest.raises(RuntimeError, match=r"asks for liger-kernel==0.8.2 but finds " + md.version("liger-kernel")):
        software.check_imported("liger-kernel==0.8.2")
    assert software.check_imported(f"liger-kernel=={md.version('liger-kernel')}") == {
        "liger-kernel": md.version("liger-kernel")
    }


def test_each_set_s_runs_import_its_releases_from_a_server_of_its_own(
    own_cache, tiny_model_dir, tiny_dataset_dir, tmp_path
):
    """The older release's run imports it (from the overlay, built once) and the installed set's run imports the
    installed one; each set's runs fork from a server of its own, whose imports were the set's."""
    forkserver.close_servers()
    try:
        runs = {}
        for name, text in (("older", f"liger-kernel=={OLDER_LIGER}"), ("installed", "")):
            args = TrainingArgs(backend="plain_loop", arm="liger", max_steps=2, device="cpu", software_set=text)
            runs[name] = run_in_child(PlannedRun(name, 0, args, ["software_set"]), tiny_dataset_dir, tiny_model_dir,
                                      tmp_path / name, 300)  # fmt: skip
        assert len(forkserver._SERVERS) == 2
    finally:
        forkserver.close_servers()
    older, installed = runs["older"], runs["installed"]
    assert older.status == installed.status == "ok", (older.error_tail, installed.error_tail)
    assert older.details["child_started"] == installed.details["child_started"] == "forked from the fork server"
    assert json.loads(older.details["imported_versions"]) == {"liger-kernel": OLDER_LIGER}
    assert older.environment["liger-kernel"] == OLDER_LIGER
    assert installed.environment["liger-kernel"] == md.version("liger-kernel")
    assert "imported_versions" not in installed.details
    assert "LigerRMSNorm" in older.liger_patches  # the older release patched the model
    assert list((own_cache / "software").iterdir())[0].name.startswith("liger-kernel_0.8.2-")
