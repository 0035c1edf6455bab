#!/usr/bin/env bash
# The projection of a whole fine-tune checked against a long measured run on a GPU machine: the inputs file's grid
# run twice through the benchmark workflow, short (as a user benchmarks: SHORT_STEPS steps, SHORT_RUNS repeats) and
# long (LONG_STEPS steps, LONG_RUNS repeats), on the same data and seed; then the short run's projection of a
# fine-tune of the long run's steps set beside what the long run measured (`python -m
# finetune_bench.analysis.projection_check SHORT_DIR LONG_DIR`).
#
# usage: [SHORT_STEPS=20] [LONG_STEPS=305] [SHORT_RUNS=3] [LONG_RUNS=1] [NUM_GPUS=1] scripts/gpu_projection.sh INPUTS OUTDIR
#   NUM_GPUS > 1 trains each run on that many GPUs with DDP.
#   OUTDIR gets short/ and long/ (each the workflow's outputs, workflow.log and raw_results.tgz: each run's
#   result.json), gpu.txt, and check.txt.
source "$(dirname "$0")/gpu_setup.sh"
short_steps=${SHORT_STEPS:-20}; long_steps=${LONG_STEPS:-305}
short_runs=${SHORT_RUNS:-3}; long_runs=${LONG_RUNS:-1}; gpus=${NUM_GPUS:-1}
rc=0
for part in short long; do
  steps=${part}_steps; runs=${part}_runs
  mkdir -p "$out/$part"
  python3 - "$inputs" "$out/$part/inputs.yaml" "${!steps}" "${!runs}" "$gpus" <<'PY'
import sys, yaml
source, target, steps, runs, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = yaml.safe_load(open(source))
cfg["training_args"]["max_steps"] = steps
cfg["n_runs"] = runs
if gpus > 1:
    cfg["training_args"].update(num_gpus=gpus, parallelism="ddp")
yaml.safe_dump(cfg, open(target, "w"), sort_keys=False)
PY
  start=$(date +%s)
  FINETUNE_BENCH_EXPORT_DIR=$out/$part python3 /tmp/site/bin/pyflyte run workflows/benchmark.py benchmarking_experiment \
    --inputs-file "$out/$part/inputs.yaml" > "$out/$part/workflow.log" 2>&1 || rc=$?
  tail -n 12 "$out/$part/workflow.log"
  echo "$part: workflow exit status $rc, wall time $(( $(date +%s) - start )) s"
  find /tmp/flyte* -path '*/run-*/result.json' -newer "$out/$part/inputs.yaml" | tar -czf "$out/$part/raw_results.tgz" -T -
done
exit $rc
