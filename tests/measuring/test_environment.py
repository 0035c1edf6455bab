import hashlib

import torch

from finetune_bench.measuring import environment as env_module
from finetune_bench.measuring.environment import LOCK_DIGEST_ENV, environment, lock_digest


def test_environment_names_the_lockfile_and_the_versions_that_change_numbers():
    record = environment(torch.device("cpu"))
    assert record["lock_sha256"] == hashlib.sha256(env_module.LOCK_FILE.read_bytes()).hexdigest()
    assert record["torch"] == torch.__version__
    for package in ("triton", "transformers", "trl", "liger-kernel"):
        assert record[package] and record[package] != "not installed"


def test_an_installed_copy_without_a_checkout_takes_the_images_lock_hash(monkeypatch, tmp_path):
    monkeypatch.setattr(env_module, "LOCK_FILE", tmp_path / "requirements.lock")
    monkeypatch.setenv(LOCK_DIGEST_ENV, "abc123")
    assert lock_digest() == "abc123"
    monkeypatch.delenv(LOCK_DIGEST_ENV)
    assert lock_digest() == "none"


def test_environment_names_this_project_s_version_and_its_checkout_s_commit(monkeypatch, tmp_path):
    import importlib.metadata
    import re

    record = environment(torch.device("cpu"))
    assert record["finetune-bench"] == importlib.metadata.version("finetune-bench")
    assert re.fullmatch(r"[0-9a-f]{12}( \+ local changes)?", record["code_commit"]), record["code_commit"]
    # an installed copy without a checkout (an image): no commit to name
    monkeypatch.setattr(env_module, "LOCK_FILE", tmp_path / "requirements.lock")
    assert env_module.code_commit() == "" and "code_commit" not in environment(torch.device("cpu"))
