"""Software sets on a cluster: registration finds the inputs file however it is written, planning installs nothing of a
set whose image registration built (and says what it needs where it must install one), and the pods get the settings
uv reaches the package index with, never a credential."""

import importlib.metadata as md
import sys

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.sources import software
from tasks import inputs_yaml, software_images
from tests.cluster.registering_shell import printed_by_a_registering_shell

OLDER_LIGER = "liger-kernel==0.8.2"
INPUTS = f"experiment_args:\n  software_set: ['', '{OLDER_LIGER}']\n"


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own and no set prepared in this process yet."""
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    software.prepare.cache_clear()
    software.conflicts.cache_clear()
    yield
    software.prepare.cache_clear()
    software.conflicts.cache_clear()


@pytest.mark.parametrize(
    "argv",
    [
        ["union", "run", "--remote", "wf.py", "benchmarking_experiment", "--inputs-file", "F.yaml"],
        ["union", "run", "--remote", "wf.py", "benchmarking_experiment", "--inputs-file=F.yaml"],
    ],
)
def test_the_inputs_file_is_found_written_either_way(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", argv)
    assert inputs_yaml.inputs_file_argument() == "F.yaml"


def test_no_inputs_file_is_none_even_when_the_flag_ends_the_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pyflyte", "run", "wf.py", "wf", "--inputs-file"])
    assert inputs_yaml.inputs_file_argument() == ""


def test_registering_with_inputs_file_equals_defines_the_set_s_train_task(tmp_path):
    """`--inputs-file=F` makes registration build the set's image as `--inputs-file F` does: a train task on it, and
    the benchmark's planning told that the set has an image."""
    inputs = tmp_path / "sets.yaml"
    inputs.write_text(INPUTS)
    code = (
        "import json, sys; sys.argv = ['union', 'run', '--remote', 'workflows/benchmark.py', "
        f"'benchmarking_experiment', '--inputs-file={inputs}']; "
        "from workflows import benchmark; from tasks.plan import plan_benchmark; "
        "print(json.dumps({'images': [t.container_image.name for t in benchmark.SOFTWARE_SET_TRAIN_TASKS], "
        f"'planning': plan_benchmark.environment.get('{software_images.IMAGED_SETS_ENV}')}}))"
    )
    found = printed_by_a_registering_shell(code)
    assert found["images"] == ["finetune-bench-train-liger-kernel-0.8.2"]
    assert found["planning"] == f'["{OLDER_LIGER}"]'


def test_planning_installs_nothing_of_a_set_with_an_image_of_its_own(own_cache, monkeypatch):
    def no_index(pins, target):
        raise AssertionError(f"planning installed {pins}")

    monkeypatch.setattr(software, "_install", no_index)
    grid = ExperimentArgs(arm=["liger", "baseline"], software_set=["", OLDER_LIGER])
    runs = software.checked_runs(plan_runs(grid, TrainingArgs(), 1), swept=True, imaged=[OLDER_LIGER])
    assert [run.refused for run in runs] == ["", "", "", ""]


def test_a_set_without_an_image_that_cannot_be_installed_says_what_planning_needs(own_cache, monkeypatch):
    """A pod without egress (or behind a proxy that re-signs TLS): uv's complaint, and what it would need."""

    def offline(command, **kwargs):
        return type("Done", (), {"returncode": 2, "stderr": "error: Failed to fetch: `https://pypi.org/simple/`"})()

    monkeypatch.setattr(software.subprocess, "run", offline)
    grid = ExperimentArgs(arm=["liger", "baseline"], software_set=["", OLDER_LIGER])
    with pytest.raises(SpecError) as refused:
        software.checked_runs(plan_runs(grid, TrainingArgs(), 1), swept=True)
    (problem,) = refused.value.problems
    assert problem.startswith(f"experiment_args.software_set '{OLDER_LIGER}': uv could not install {OLDER_LIGER}")
    for needed in ("package index", "HTTPS_PROXY", "UV_INDEX_URL", "UV_NATIVE_TLS", "SSL_CERT_FILE", "inputs file"):
        assert needed in problem


def test_planning_reads_the_imaged_sets_only_in_a_pod(monkeypatch):
    monkeypatch.setenv(software_images.IMAGED_SETS_ENV, f'["{OLDER_LIGER}"]')
    assert software_images.imaged_sets() == []  # a local run installs its sets here
    monkeypatch.setattr(software_images, "on_cluster", lambda: True)
    assert software_images.imaged_sets() == [OLDER_LIGER]
    monkeypatch.setenv(software_images.IMAGED_SETS_ENV, "not json")
    assert software_images.imaged_sets() == []


def test_on_the_set_s_image_its_release_is_checked_against_the_arm(monkeypatch):
    """What planning left to the set's image: a liger arm its installed release cannot patch is refused there, before
    anything is launched; another set's run, or a release this process does not have, is left as it is."""
    from finetune_bench.inputs import arms

    installed = f"liger-kernel=={md.version('liger-kernel')}"
    t = TrainingArgs(model_name="random:tiny-llama", arm="liger", software_set=installed)
    run = PlannedRun("c", 0, t, ["software_set"])
    assert software.with_release_checked(run).refused == ""
    monkeypatch.setattr(arms, "supported_model_types", lambda root="": ["gemma"])
    refused = software.with_release_checked(run).refused
    assert refused.startswith("arm 'liger': liger-kernel ") and "has no kernels for model type 'llama'" in refused
    other = PlannedRun("c", 0, TrainingArgs(model_name="random:tiny-llama", arm="liger", software_set=OLDER_LIGER), [])
    assert software.with_release_checked(other).refused == ""  # not this image's release: its own image checks it


def test_the_pods_get_uv_s_and_the_proxy_s_settings_but_no_credential_or_local_path():
    code = "import json; from tasks import registration as s; print(json.dumps(s.REGISTRATION_ENV))"
    env = printed_by_a_registering_shell(
        code,
        UV_INDEX_URL="https://mirror.example.com/simple",
        UV_NATIVE_TLS="1",
        HTTPS_PROXY="http://proxy.example.com:3128",
        NO_PROXY="localhost,.svc",
        UV_EXTRA_INDEX_URL="https://me:s3cretTOKEN@private.example.com/simple",
        HTTP_PROXY="http://me:s3cretTOKEN@proxy.example.com:3128",
        UV_DEFAULT_INDEX="https://mirror.example.com/simple?token=s3cretTOKEN",
        SSL_CERT_FILE="/home/me/corporate-ca.pem",
        UV_CACHE_DIR="/home/me/.cache/uv",
    )
    assert env["UV_INDEX_URL"] == "https://mirror.example.com/simple"
    assert env["UV_NATIVE_TLS"] == "1" and env["HTTPS_PROXY"] == "http://proxy.example.com:3128"
    assert env["NO_PROXY"] == "localhost,.svc"
    for left_out in ("UV_EXTRA_INDEX_URL", "HTTP_PROXY", "UV_DEFAULT_INDEX", "SSL_CERT_FILE", "UV_CACHE_DIR"):
        assert left_out not in env
    assert "s3cretTOKEN" not in str(env)


def test_every_form_of_a_credential_in_a_url_keeps_the_setting_from_the_pods():
    from tasks.registration import carries_credentials

    for value in (
        "https://me:s3cret@private.example.com/simple",
        "https://TOKEN@pypi.fury.io/me/",
        "https://mirror.example/simple?token=SECRET",
        "https://mirror.example/simple/?a=1&api_key=SECRET",
        "https://mirror.example/simple#SECRET",
        "https://ok.example/simple https://me:pw@other.example/simple",  # one of several
        "http://proxy.example.com:3128,http://me:pw@proxy2.example.com",
    ):
        assert carries_credentials(value), value
    for value in ("https://mirror.example.com/simple", "http://proxy.example.com:3128", "localhost,.svc", "1"):
        assert not carries_credentials(value), value
