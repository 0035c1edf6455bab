#!/usr/bin/env bash
# Run a memory-frontier inputs file through the workflow (`pyflyte run workflows/frontier.py memory_frontier`, as
# `make frontier` does) on a GPU machine whose image lacks flytekit/trl/liger: install the wheelhouse carried in
# .whl/, then the workflow, then keep what it measured.
#
# usage: scripts/gpu_frontier.sh INPUTS OUTDIR
#   OUTDIR gets gpu.txt (the GPUs), workflow.log, frontiers.csv, probes.csv, summary.txt, and outputs.tgz: every
#   exported output (the report, environment.json, ...) with each probe's condition, result and log (kept whatever
#   happens to the report).
# Where the project is installed (`make install`), `make frontier FRONTIER_INPUTS=...` runs the same workflow.
source "$(dirname "$0")/gpu_setup.sh"
export FINETUNE_BENCH_EXPORT_DIR=/tmp/frontier_outputs
start=$(date +%s)
rc=0
# WORKFLOW_TIMEOUT_S (default none): stop the workflow then, and keep what its probes measured
timeout "${WORKFLOW_TIMEOUT_S:-0}" python3 /tmp/site/bin/pyflyte run workflows/frontier.py memory_frontier --inputs-file "$inputs" \
  > "$out/workflow.log" 2>&1 || rc=$?
tail -n 30 "$out/workflow.log"
echo "workflow exit status $rc, wall time: $(( $(date +%s) - start )) s"
for f in frontiers.csv probes.csv summary.txt; do
  if [ -f "$FINETUNE_BENCH_EXPORT_DIR/$f" ]; then cp "$FINETUNE_BENCH_EXPORT_DIR/$f" "$out/"; fi
done
# Every output and each probe's own files, so that nothing measured is lost whatever happens to the report.
{ find "$FINETUNE_BENCH_EXPORT_DIR" -type f 2>/dev/null
  find /tmp/flyte* -path '*/frontier-*/probe-*' -type f \( -name 'condition.json' -o -name 'result.json' \
    -o -name 'child.log' -o -name 'steps.csv' \) -newer "$out/gpu.txt" 2>/dev/null; } | tar -czf "$out/outputs.tgz" -T -
exit $rc
