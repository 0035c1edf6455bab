#!/usr/bin/env bash
# The projection of a whole fine-tune checked against a long measured run on a GPU machine: the inputs file's grid
# run twice through the benchmark workflow, short (as a user benchmarks: SHORT_STEPS steps, SHORT_RUNS repeats) and
# long (LONG_STEPS steps, LONG_RUNS repeats), on the same data and seed; then the short run's projection of a
# fine-tune of the long run's steps set beside what the long run measured (`python -m
# scripts/projection_check.py SHORT_DIR LONG_DIR`).
#
# usage: [SHORT_STEPS=20] [LONG_STEPS=305] [SHORT_RUNS=3] [LONG_RUNS=1] [NUM_GPUS=1] [PAD_TO=0] \
#        scripts/gpu_projection.sh INPUTS OUTDIR
#   NUM_GPUS > 1 trains each run on that many GPUs with DDP; PAD_TO > 0 sets pad_to_multiple_of.
#   PIN="packing=true attention=sdpa" sets each named setting in training_args and stops sweeping it (the other
#   axes, the arm's among them, stay swept): one configuration of a grid that sweeps the remedies.
#   FRESH_JIT_CACHE=1 gives each part an empty CUDA JIT cache (CUDA_CACHE_PATH), as a fresh pod has: the long part
#   then meets no kernel the short part's runs left compiled on the machine. Each part's cache size is printed.
#   PARTS=long runs the long part alone (on a machine whose results store kept an earlier call's runs: LONG_RUNS=2
#   then reuses run 0, stored, and adds run 1), and the check is left to be run where both parts' archives are.
#   OUTDIR gets gpu.txt, check.txt, short.tgz and long.tgz: short/ and long/, each the workflow's outputs,
#   workflow.log and every run's result.json and steps.csv from the results store.
source "$(dirname "$0")/gpu_setup.sh"
short_steps=${SHORT_STEPS:-20}; long_steps=${LONG_STEPS:-305}
short_runs=${SHORT_RUNS:-3}; long_runs=${LONG_RUNS:-1}; gpus=${NUM_GPUS:-1}; pad_to=${PAD_TO:-0}
rc=0
for part in ${PARTS:-short long}; do
  steps=${part}_steps; runs=${part}_runs
  mkdir -p "$out/$part"
  python3 - "$inputs" "$out/$part/inputs.yaml" "${!steps}" "${!runs}" "$gpus" "$long_steps" "$pad_to" "${PIN:-} $([ $part = long ] && echo "${LONG_PIN:-}")" <<'PY'
import sys, yaml
source, target = sys.argv[1], sys.argv[2]
steps, runs, gpus, long_steps, pad_to = (int(value) for value in sys.argv[3:8])
cfg = yaml.safe_load(open(source))
for pin in sys.argv[8].split():
    name, value = pin.split("=", 1)
    cfg.get("experiment_args", {}).pop(name, None)
    cfg["training_args"][name] = yaml.safe_load(value)
cfg["training_args"]["max_steps"] = steps
cfg["n_runs"] = runs
cfg["fine_tune_steps"] = long_steps  # the short runs project the long run
cfg.pop("fine_tune_epochs", None)
if pad_to:
    cfg["training_args"]["pad_to_multiple_of"] = pad_to
if gpus > 1:
    cfg["training_args"].update(num_gpus=gpus, parallelism="ddp")
yaml.safe_dump(cfg, open(target, "w"), sort_keys=False)
PY
  if [ "${FRESH_JIT_CACHE:-0}" = 1 ]; then export CUDA_CACHE_PATH=$out/jit-cache-$part; mkdir -p "$CUDA_CACHE_PATH"; fi
  start=$(date +%s)
  FINETUNE_BENCH_EXPORT_DIR=$out/$part python3 /tmp/site/bin/pyflyte run workflows/benchmark.py benchmarking_experiment \
    --inputs-file "$out/$part/inputs.yaml" > "$out/$part/workflow.log" 2>&1 || rc=$?
  tail -n 12 "$out/$part/workflow.log"
  echo "$part: workflow exit status $rc, wall time $(( $(date +%s) - start )) s"
  echo "$part: CUDA JIT cache $(du -sh "${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}" 2>/dev/null || echo 'none')"
  find "$FINETUNE_BENCH_CACHE_DIR/results" \( -name result.json -o -name steps.csv \) -newer "$out/$part/inputs.yaml" \
    | tar -czf "$out/$part/stored_runs.tgz" -T - 2>/dev/null
  tar -czf "$out/$part.tgz" -C "$out" "$part"  # kept whatever happens next
done
if [ -d "$out/short" ] && [ -d "$out/long" ]; then
  python3 scripts/projection_check.py "$out/short" "$out/long" | tee "$out/check.txt" || rc=$?
fi
# One file a part back (the machine returns a limited number of files).
rm -rf "$out/short" "$out/long" "$out"/jit-cache-*
exit $rc
