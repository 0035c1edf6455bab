"""The images are built from the lockfile's pins, the same ones `make` and CI install from."""

import re

from images.images import LOCK_DIGEST, LOCK_DIGEST_ENV, LOCK_FILE, TRAINING_ONLY, analysis_image, training_image


def _pins() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.\-]+==\S+)", LOCK_FILE.read_text(), flags=re.M))


def _names(packages: list[str]) -> set[str]:
    return {re.split(r"==", p)[0].lower().replace("_", "-") for p in packages}


def test_training_image_installs_exactly_the_locked_versions_and_the_switchback_extra():
    assert set(training_image.packages) == _pins() | {"bitsandbytes==0.49.2"}
    assert all("==" in package for package in training_image.packages)
    assert {"torch", "triton", "transformers", "trl", "liger-kernel", "flytekit"} <= _names(training_image.packages)


def test_analysis_image_has_the_same_pins_without_the_training_stack():
    assert set(analysis_image.packages) <= _pins()
    assert not _names(analysis_image.packages) & set(TRAINING_ONLY)
    assert {"pandas", "seaborn", "scipy", "flytekit"} <= _names(analysis_image.packages)


def test_both_images_record_the_lockfile_hash():
    import hashlib

    assert LOCK_DIGEST == hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()
    assert training_image.env[LOCK_DIGEST_ENV] == LOCK_DIGEST
    assert analysis_image.env[LOCK_DIGEST_ENV] == LOCK_DIGEST


def test_the_lock_pins_torch_and_the_triton_its_cuda_build_requires():
    text = LOCK_FILE.read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+$", text, flags=re.M), "torch pinned without a local build label"
    assert re.search(r"^triton==\d+\.\d+\.\d+$", text, flags=re.M)
