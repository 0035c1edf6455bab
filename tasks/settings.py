"""Task resources, read from the environment when the workflow is registered or run.

- FINETUNE_BENCH_TRAIN_GPU (default 1), FINETUNE_BENCH_TRAIN_CPU (8), FINETUNE_BENCH_TRAIN_MEM (64Gi)
- FINETUNE_BENCH_TRAIN_ACCELERATOR: a GPU type such as `nvidia-tesla-a100`, `nvidia-h100`,
  `nvidia-l4` (unset: any GPU the cluster gives)
- FINETUNE_BENCH_HF_TOKEN_SECRET: the key of a Flyte secret holding a Hugging Face token (for
  gated models such as Llama); unset: downloads are anonymous
"""

import os

from flytekit import Resources, Secret
from flytekit.extras.accelerators import GPUAccelerator

TRAIN_RESOURCES = Resources(
    cpu=os.environ.get("FINETUNE_BENCH_TRAIN_CPU", "8"),
    mem=os.environ.get("FINETUNE_BENCH_TRAIN_MEM", "64Gi"),
    gpu=os.environ.get("FINETUNE_BENCH_TRAIN_GPU", "1"),
)
_accelerator = os.environ.get("FINETUNE_BENCH_TRAIN_ACCELERATOR")
TRAIN_ACCELERATOR = GPUAccelerator(_accelerator) if _accelerator else None

DOWNLOAD_RESOURCES = Resources(cpu="4", mem="32Gi")
ANALYSIS_RESOURCES = Resources(cpu="2", mem="4Gi")

HF_TOKEN_SECRET_KEY = os.environ.get("FINETUNE_BENCH_HF_TOKEN_SECRET")
HF_SECRETS = [Secret(key=HF_TOKEN_SECRET_KEY)] if HF_TOKEN_SECRET_KEY else []

# Bump to invalidate cached downloads after a change to what they write.
DOWNLOAD_CACHE_VERSION = "1"
