"""What every task is registered with (its resources, GPU, environment and secrets), read from the environment
when the workflow is registered or run.

- FINETUNE_BENCH_TRAIN_GPU (default 1), FINETUNE_BENCH_TRAIN_CPU (8), FINETUNE_BENCH_TRAIN_MEM (64Gi)
- FINETUNE_BENCH_TRAIN_ACCELERATOR: a GPU type such as `nvidia-tesla-a100`, `nvidia-h100`,
  `nvidia-l4` (unset: `nvidia-tesla-a100`; set empty: any GPU the cluster gives); an inputs file's
  `accelerator` overrides it for the benchmark's train tasks
- FINETUNE_BENCH_HF_TOKEN_SECRET: the key of a Flyte secret holding a Hugging Face token (for
  gated models such as Llama); unset: downloads are anonymous
- WANDB_ENTITY: a W&B user or team. Set: the training task requests the Flyte secret
  FINETUNE_BENCH_WANDB_SECRET (default `wandb_api_key`) holding a W&B API key, logs each run online
  and gets a Weights & Biases link in the Flyte UI. Unset: no secret, no link; runs are logged offline
  on a local run (online if WANDB_API_KEY is set), not at all on a remote one.
- WANDB_PROJECT (default `finetune-bench`), WANDB_MODE (online / offline / disabled),
  WANDB_BASE_URL (the W&B API server, default https://api.wandb.ai for the remote runs) and
  WANDB_APP_URL (its UI, for the link; default https://wandb.ai, or derived from WANDB_BASE_URL)
- uv's and the proxy's settings (`NETWORK_SETTINGS`: UV_INDEX_URL, UV_NATIVE_TLS, HTTPS_PROXY, ...): how a pod that
  installs a software set with uv reaches the package index; a value holding a credential is not handed on
"""

import os
from urllib.parse import urlsplit

from flytekit import Resources, Secret
from flytekit.extras.accelerators import GPUAccelerator

from finetune_bench.prediction.grid import ACCELERATOR_ENV, train_accelerator
from finetune_bench.sources.cache import dataset_preparation_version, model_preparation_version
from images.images import REGISTRY_ENV

TRAIN_RESOURCES = Resources(
    cpu=os.environ.get("FINETUNE_BENCH_TRAIN_CPU", "8"),
    mem=os.environ.get("FINETUNE_BENCH_TRAIN_MEM", "64Gi"),
    gpu=os.environ.get("FINETUNE_BENCH_TRAIN_GPU", "1"),
)


def train_resources(num_gpus: int) -> Resources:
    """What the train task of a layout with `num_gpus` GPUs per node asks of each node: that many GPUs, and the
    CPUs and memory of a one-GPU task that many times."""
    return Resources(
        cpu=str(int(TRAIN_RESOURCES.cpu) * num_gpus) if str(TRAIN_RESOURCES.cpu).isdigit() else TRAIN_RESOURCES.cpu,
        mem=_times(TRAIN_RESOURCES.mem, num_gpus),
        gpu=str(num_gpus),
    )


def _times(quantity: str, factor: int) -> str:
    """A Kubernetes quantity such as `64Gi` times `factor`."""
    number = quantity.rstrip("KMGTPEikmgtpe")
    return f"{int(number) * factor}{quantity[len(number) :]}" if number.isdigit() else quantity


# The accelerator the train tasks are registered with (a Flyte accelerator name; empty: any GPU): what they ask for,
# and what a cluster's plan predicts for when the inputs name no GPU (`tasks.plan.predicted_accelerator`).
REGISTERED_ACCELERATOR = train_accelerator()
TRAIN_ACCELERATOR = GPUAccelerator(REGISTERED_ACCELERATOR) if REGISTERED_ACCELERATOR else None

DOWNLOAD_RESOURCES = Resources(cpu="4", mem="32Gi")
ANALYSIS_RESOURCES = Resources(cpu="2", mem="4Gi")
# The dynamic nodes (run_benchmark, run_searches, run_kernels) train nothing, but their pods import the task modules
# and compile the sub-tasks: run_benchmark's imports torch and the Elastic plugin to define the train tasks and peaks
# at 400-670 MB, the others at about half of that. Without a request a pod gets the platform's default, a few hundred
# MB on some, and is killed for memory. 2Gi leaves room for a large grid's literals; one CPU, as compiling is serial.
# No limits, as for every task here: Flyte gives a resource requested without a limit a limit of the same size.
DYNAMIC_NODE_RESOURCES = Resources(cpu="1", mem="2Gi")

HF_TOKEN_SECRET_KEY = os.environ.get("FINETUNE_BENCH_HF_TOKEN_SECRET")
HF_SECRETS = [Secret(key=HF_TOKEN_SECRET_KEY)] if HF_TOKEN_SECRET_KEY else []

WANDB_ENTITY = os.environ.get("WANDB_ENTITY") or None
WANDB_PROJECT = os.environ.get("WANDB_PROJECT") or "finetune-bench"
WANDB_SECRET_KEY = os.environ.get("FINETUNE_BENCH_WANDB_SECRET") or "wandb_api_key"


def wandb_disabled() -> bool:
    """WANDB_MODE=disabled: W&B turned off (read when asked; in a pod, the registered value)."""
    return os.environ.get("WANDB_MODE", "").strip().lower() == "disabled"


WANDB_DISABLED = wandb_disabled()
# Requested (the pods cannot start without it on some clusters) only when W&B is asked for and not turned off.
WANDB_SECRETS = [Secret(key=WANDB_SECRET_KEY)] if WANDB_ENTITY and not WANDB_DISABLED else []
WANDB_API_URL = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").rstrip("/")
WANDB_APP_URL = (os.environ.get("WANDB_APP_URL") or WANDB_API_URL.replace("://api.", "://", 1)).rstrip("/")
# The settings above (and the images' registry, part of their ids) as they were at registration, handed to the
# container of every task, so that a pod imports the same task definitions and images as the ones registered: the
# @dynamic nodes build their sub-tasks from them at run time. Never a key or token. A setting set empty is left out
# (each falls back to its default), except the accelerator, for which empty means any GPU.
REGISTRATION_ENV = {
    name: os.environ[name]
    for name in (
        REGISTRY_ENV,
        "FINETUNE_BENCH_TRAIN_CPU",
        "FINETUNE_BENCH_TRAIN_MEM",
        "FINETUNE_BENCH_TRAIN_GPU",
        "FINETUNE_BENCH_TRAIN_ACCELERATOR",
        "FINETUNE_BENCH_HF_TOKEN_SECRET",
        "WANDB_ENTITY",
        "WANDB_PROJECT",
        "WANDB_BASE_URL",
        "WANDB_APP_URL",
        "FINETUNE_BENCH_WANDB_SECRET",
    )
    if os.environ.get(name) or (name == ACCELERATOR_ENV and name in os.environ)
}
# Where uv finds packages and how it reaches them (through a proxy, trusting the system's certificates), as at
# registration: a pod installs a software set whose image registration did not build with uv
# (`finetune_bench.sources.software`). Only values that name no path of this machine and carry no credential: an
# index URL with a user, password or token in it or a query string (`carries_credentials`), or a certificate file (a
# path here, not in a pod), is left out.
NETWORK_SETTINGS = (
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "UV_INDEX_STRATEGY",
    "UV_NATIVE_TLS",
    "UV_INSECURE_HOST",
    "UV_HTTP_TIMEOUT",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
)


def carries_credentials(value: str) -> bool:
    """Whether a setting's value may hold a credential: a URL with a user, password or token before its host
    (`https://user:pass@host/...`, `https://TOKEN@host/...`), or with a query string or fragment (`...?token=SECRET`,
    `...&api_key=...`: an index's token is often passed so). Such a value is not passed to the pods at all."""
    for url in value.replace(",", " ").split():
        if "://" not in url:
            continue
        parts = urlsplit(url)
        if "@" in parts.netloc or parts.query or parts.fragment or "?" in url:
            return True
    return False


REGISTRATION_ENV.update(
    {
        name: os.environ[name]
        for name in NETWORK_SETTINGS
        if os.environ.get(name) and not carries_credentials(os.environ[name])
    }
)
# WANDB_MODE=disabled turns W&B off remotely too; an `offline` left over from local runs is not passed on
# (an offline run would die with its pod).
if WANDB_DISABLED:
    REGISTRATION_ENV["WANDB_MODE"] = "disabled"

# Bump to invalidate cached downloads after a change to what they write that their code does not show (the libraries
# that write them, say): a change to the code that prepares them changes the versions below by itself.
DOWNLOAD_CACHE_VERSION = "1"
# The download tasks' cache versions. Flyte's cache key is a task's inputs (what is downloaded) and its cache version,
# a string fixed at registration: here the hash of the code that prepares a dataset or a model, so that after a change
# to how either is prepared a run gets a prepared copy of the new code, not the one cached before.
DATASET_CACHE_VERSION = f"{DOWNLOAD_CACHE_VERSION}-{dataset_preparation_version()}"
MODEL_CACHE_VERSION = f"{DOWNLOAD_CACHE_VERSION}-{model_preparation_version()}"
