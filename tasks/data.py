"""Cached download tasks: a dataset and a model, each as a directory, cached under what is downloaded and the version
of the code that prepares it (`tasks.registration.DATASET_CACHE_VERSION`, `MODEL_CACHE_VERSION`)."""

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import click
from flytekit import current_context, task
from flytekit.core.promise import Promise
from flytekit.types.directory import FlyteDirectory

from finetune_bench.inputs.plan import PlannedRun, not_launched, nothing_to_launch
from finetune_bench.inputs.secrets import redact
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources.datasets import DatasetSource, prepare_dataset
from finetune_bench.sources.models import prepare_model
from finetune_bench.sources.versions import SourceVersions, source_versions
from images import training_image
from tasks.execution import on_cluster
from tasks.registration import (
    DATASET_CACHE_VERSION,
    DOWNLOAD_RESOURCES,
    HF_SECRETS,
    HF_TOKEN_SECRET_KEY,
    MODEL_CACHE_VERSION,
    REGISTRATION_ENV,
)

logger = logging.getLogger(__name__)


class SourceUnavailable(click.ClickException):
    """A model or dataset that cannot be fetched or read (no such hub id, no access, a file datasets cannot
    load). A click error: the CLI prints it in a few lines, without a traceback."""


@contextlib.contextmanager
def _source_errors(kind: str, name: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # whatever the hub, the network or `datasets` raised: said in one line
        message = redact(f"the {kind} {name!r} could not be prepared: {type(exc).__name__}: {exc}")
        raise SourceUnavailable(message.splitlines()[0] if message.strip() else message) from exc


def _hf_token() -> str | None:
    if not HF_TOKEN_SECRET_KEY:
        return None
    return current_context().secrets.get(key=HF_TOKEN_SECRET_KEY)


@task(
    container_image=training_image,
    cache=True,
    cache_version=DATASET_CACHE_VERSION,
    requests=DOWNLOAD_RESOURCES,
    secret_requests=HF_SECRETS,
    environment=REGISTRATION_ENV,
)
def download_dataset(
    dataset_name: str,
    dataset_split: str,
    synthetic_num_examples: int,
    synthetic_min_words: int,
    synthetic_max_words: int,
    dataset_config: str,
    synthetic_length_distribution: str,
    version: str = "",
) -> FlyteDirectory:
    """Fetch or generate the dataset into a persistent directory (`datasets.save_to_disk` format).
    `version` (see `identify_sources`) is part of the cache key: an edited local dataset, or a prepared copy
    that is gone, is prepared again instead of served from the cache."""
    with _source_errors("dataset", dataset_name):
        source = DatasetSource(
            dataset_name=dataset_name,
            dataset_split=dataset_split,
            dataset_config=dataset_config,
            synthetic_num_examples=synthetic_num_examples,
            synthetic_min_words=synthetic_min_words,
            synthetic_max_words=synthetic_max_words,
            synthetic_length_distribution=synthetic_length_distribution,
        )
        path = prepare_dataset(source, hf_token=_hf_token())
    logger.info("dataset %s ready at %s", dataset_name, path)
    return FlyteDirectory(str(path))


@task(
    container_image=training_image,
    cache=True,
    cache_version=MODEL_CACHE_VERSION,
    requests=DOWNLOAD_RESOURCES,
    secret_requests=HF_SECRETS,
    environment=REGISTRATION_ENV,
)
def download_model(model_name: str, version: str = "") -> FlyteDirectory:
    """Fetch the model (hub id), use a local one, or write a random-init one, as a directory. `version` (see
    `identify_sources`) is part of the cache key."""
    with _source_errors("model", model_name):
        path = prepare_model(model_name, hf_token=_hf_token())
    logger.info("model %s ready at %s", model_name, path)
    return FlyteDirectory(str(path))


@task(container_image=training_image, requests=DOWNLOAD_RESOURCES, environment=REGISTRATION_ENV)
def identify_sources(training_args: TrainingArgs) -> SourceVersions:
    """The versions of the dataset and the model (never cached: it reads local sources and, in a local run, the
    cache directory each time, downloading nothing)."""
    return source_versions(training_args, local=not on_cluster())


def download_sources(training_args: Promise, after: Promise) -> tuple[Promise, Promise, Promise]:
    """In a workflow: the dataset and the model of `training_args` (a workflow input), downloaded once
    `after` (the node that validates the inputs) has succeeded, so nothing is fetched for bad inputs; and
    their versions (`SourceVersions`), which the results store's keys include."""
    versions = identify_sources(training_args=training_args)
    after >> versions
    # the task's inputs are the dataset settings of `training_args`, by name
    dataset_settings = {field.name: getattr(training_args, field.name) for field in dataclasses.fields(DatasetSource)}
    dataset_dir = download_dataset(**dataset_settings, version=versions.dataset_cache_key)
    model_dir = download_model(model_name=training_args.model_name, version=versions.model_cache_key)
    return dataset_dir, model_dir, versions


@task(container_image=training_image, requests=DOWNLOAD_RESOURCES, environment=REGISTRATION_ENV)
def check_training_data(
    planned: list[PlannedRun], dataset_dir: FlyteDirectory, model_dir: FlyteDirectory
) -> list[PlannedRun]:
    """The planned runs, those whose downloaded data cannot fill one batch at their max_seq_length, or whose
    model_config_overrides the downloaded model's config refuses, refused (they end as error results saying why,
    without being launched on a GPU). A grid none of whose runs is left to launch fails here, naming each reason."""
    from finetune_bench.running.preflight import refuse_invalid_overrides, refuse_unfillable  # torch: only here

    model_path = Path(model_dir.download())
    checked = refuse_unfillable(refuse_invalid_overrides(planned, model_path), Path(dataset_dir.download()), model_path)
    message = nothing_to_launch(checked)
    if message:
        raise NothingToLaunch(message)
    for reason in not_launched([run for before, run in zip(planned, checked, strict=True) if run != before]):
        logger.warning(reason)
    return checked


class NothingToLaunch(click.ClickException):
    """No run of the grid can be launched: an input error, before any GPU is asked for (a click error: the CLI prints
    each reason once, without a traceback)."""
