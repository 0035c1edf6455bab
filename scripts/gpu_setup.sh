# Sourced by the GPU scripts (scripts/gpu_check.sh, scripts/gpu_frontier.sh) with their arguments, INPUTS and OUTDIR:
# the wheelhouse carried in .whl/ installed where the machine's image lacks the project's packages, the environment a
# `pyflyte run` there needs, and the machine's GPUs written to OUTDIR/gpu.txt.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 INPUTS OUTDIR" >&2
  exit 2
fi
inputs=$1; out=$2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLYTECTL_CONFIG=$PWD/flyte-local.yaml
export FINETUNE_BENCH_CACHE_DIR=/tmp/finetune_bench_cache
# The image has no wandb package: W&B is off (else every run would end with a problem, "not logged").
export WANDB_MODE=disabled
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
