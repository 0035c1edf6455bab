set -u
b=$1
python3 - $b <<'PY'
import sys, yaml
cfg = yaml.safe_load(open("inputs/llama1b_measure.yaml"))
cfg["experiment_args"]["backend"] = [sys.argv[1]]
cfg["training_args"].update(max_steps=16, timing_warmup_steps=4, synthetic_num_examples=544)
yaml.safe_dump(cfg, open(f"/tmp/{sys.argv[1]}.yaml", "w"))
PY
timeout 570 bash scripts/gpu_check.sh /tmp/$b.yaml $OUT/$b
