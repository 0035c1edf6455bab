set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FINETUNE_BENCH_CACHE_DIR=/tmp/fbc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
# 1. spike hunt: 30 steps, liger bs8, gc on and off
python3 scripts/hand_loop.py --batch 8 --seq 2048 --steps 30 --warmup 4 --liger >> $OUT/diag.jsonl 2>>$OUT/err.txt
python3 -c "import gc,runpy,sys; gc.disable(); sys.argv=['hand_loop','--batch','8','--seq','2048','--steps','30','--warmup','4','--liger']; runpy.run_path('scripts/hand_loop.py', run_name='__main__')" >> $OUT/diag.jsonl 2>>$OUT/err.txt
# 2. hand loop yardstick, with clipping (default)
for b in 4 8 16 32; do for l in --liger ""; do
  python3 scripts/hand_loop.py --batch $b --seq 2048 --steps 16 --warmup 4 $l >> $OUT/hand.jsonl 2>>$OUT/err.txt || echo "{\"batch\": $b, \"liger\": \"$l\", \"failed\": true}" >> $OUT/hand.jsonl
done; done
# 3. one plain-loop and one trl_sft (model criterion) liger bs8 run, 30 steps: per-step gc/malloc columns
python3 scripts/gpu_grid.py inputs/llama1b_measure.yaml /tmp/g1 --set 'experiment_args.backend=["plain_loop","trl_sft"]' --set 'experiment_args.use_liger=[true]' --set 'experiment_args.per_device_train_batch_size=[8]' --set training_args.max_steps=30 --set training_args.timing_warmup_steps=4 --set n_runs=1 > $OUT/grid1.log 2>&1
cp /tmp/g1/results.csv $OUT/g1_results.csv; cp /tmp/g1/steps.csv $OUT/g1_steps.csv
tail -5 $OUT/err.txt
