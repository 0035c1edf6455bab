"""Cached download tasks: a dataset and a model, each as a directory."""

import logging

from flytekit import current_context, task
from flytekit.core.promise import Promise
from flytekit.types.directory import FlyteDirectory

from finetune_bench.sources.datasets import prepare_dataset
from finetune_bench.sources.models import prepare_model
from images import training_image
from tasks.settings import (
    DOWNLOAD_CACHE_VERSION,
    DOWNLOAD_RESOURCES,
    HF_SECRETS,
    HF_TOKEN_SECRET_KEY,
    REGISTRATION_ENV,
)

logger = logging.getLogger(__name__)


def _hf_token() -> str | None:
    if not HF_TOKEN_SECRET_KEY:
        return None
    return current_context().secrets.get(key=HF_TOKEN_SECRET_KEY)


@task(
    container_image=training_image,
    cache=True,
    cache_version=DOWNLOAD_CACHE_VERSION,
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
) -> FlyteDirectory:
    """Fetch or generate the dataset into a persistent directory (`datasets.save_to_disk` format)."""
    path = prepare_dataset(
        dataset_name,
        split=dataset_split,
        synthetic_num_examples=synthetic_num_examples,
        synthetic_min_words=synthetic_min_words,
        synthetic_max_words=synthetic_max_words,
        hf_token=_hf_token(),
        config=dataset_config,
        synthetic_length_distribution=synthetic_length_distribution,
    )
    logger.info("dataset %s ready at %s", dataset_name, path)
    return FlyteDirectory(str(path))


@task(
    container_image=training_image,
    cache=True,
    cache_version=DOWNLOAD_CACHE_VERSION,
    requests=DOWNLOAD_RESOURCES,
    secret_requests=HF_SECRETS,
    environment=REGISTRATION_ENV,
)
def download_model(model_name: str) -> FlyteDirectory:
    """Fetch the model (hub id), use a local one, or write a random-init one, as a directory."""
    path = prepare_model(model_name, hf_token=_hf_token())
    logger.info("model %s ready at %s", model_name, path)
    return FlyteDirectory(str(path))


def download_sources(training_args: Promise, after: Promise) -> tuple[Promise, Promise]:
    """In a workflow: the dataset and the model of `training_args` (a workflow input), downloaded once
    `after` (the node that validates the inputs) has succeeded, so nothing is fetched for bad inputs."""
    dataset_dir = download_dataset(
        dataset_name=training_args.dataset_name,
        dataset_split=training_args.dataset_split,
        synthetic_num_examples=training_args.synthetic_num_examples,
        synthetic_min_words=training_args.synthetic_min_words,
        synthetic_max_words=training_args.synthetic_max_words,
        dataset_config=training_args.dataset_config,
        synthetic_length_distribution=training_args.synthetic_length_distribution,
    )
    model_dir = download_model(model_name=training_args.model_name)
    after >> dataset_dir
    after >> model_dir
    return dataset_dir, model_dir
