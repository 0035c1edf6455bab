#!/usr/bin/env bash
# Run an inputs file's grid through the benchmark workflow (`pyflyte run`, as `make run` does) on a GPU machine
# whose image lacks flytekit/trl/liger: install the wheelhouse carried in .whl/, pre-flight one short liger run of
# the file's model and data, then the whole workflow.
#
# usage: [WORKFLOW_TIMEOUT_S=SECONDS] [PREFLIGHT=0] scripts/gpu_check.sh INPUTS OUTDIR
#   INPUTS  any benchmark inputs file; for a shorter grid (fewer steps or repeats, another backend), a copy of one
#           with those settings changed
#   WORKFLOW_TIMEOUT_S  ends the workflow after that many seconds (SIGTERM: its run ends, no process left), for a
#           grid longer than one sitting: its finished runs stay in the results store, and the same command again on
#           the same machine reuses them and trains the rest (exit status 124 when stopped). PREFLIGHT=0 skips the
#           pre-flight run (a second call).
#   OUTDIR  gets gpu.txt (the GPU), workflow.log, the workflow's outputs (report.html, results.csv, steps.csv, ...)
#           and raw_results.tgz (each run's result.json, kept whatever happens to the analysis)
# Where the project is installed (`make install`), `make run INPUTS=... RUN_DIR=...` runs the same workflow.
source "$(dirname "$0")/gpu_setup.sh"
export FINETUNE_BENCH_EXPORT_DIR=$out
[ "${PREFLIGHT:-1}" = 0 ] || python3 - "$inputs" <<'PY'
import dataclasses, sys, yaml
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.running.launch import run_in_child
from finetune_bench.sources.datasets import DatasetSource, prepare_dataset
from finetune_bench.sources.models import prepare_model
cfg = yaml.safe_load(open(sys.argv[1]))
args = TrainingArgs(**cfg["training_args"])
args = dataclasses.replace(args, max_steps=3, timing_warmup_steps=1)
run = plan_runs(ExperimentArgs(arm=["liger"], per_device_train_batch_size=[args.per_device_train_batch_size]), args, 1)[0]
ds = prepare_dataset(DatasetSource.of(args))
md = prepare_model(args.model_name)
r = run_in_child(run, ds, md, "/tmp/preflight", 900)
print("preflight:", r.status, r.reason, r.metrics, r.liger_patches, f"{r.wall_time_s:.1f}s")
if r.status != "ok":
    print(r.error_tail); sys.exit(1)
PY
start=$(date +%s)
rc=0
timeout --kill-after=60 "${WORKFLOW_TIMEOUT_S:-0}" python3 /tmp/site/bin/pyflyte run workflows/benchmark.py benchmarking_experiment --inputs-file "$inputs" \
  > "$out/workflow.log" 2>&1 || rc=$?
tail -n 30 "$out/workflow.log"
echo "workflow exit status $rc, wall time: $(( $(date +%s) - start )) s"
# The raw per-run records, so that nothing measured is lost whatever happens to the analysis.
find /tmp/flyte* -path '*/run-*/result.json' -newer "$out/gpu.txt" | tar -czf "$out/raw_results.tgz" -T -
exit $rc
