"""A minimal hand-written training loop, the yardstick for the plain-loop backend's overhead.

Random-init causal LM from a bundled architecture config, random token batches of exactly
batch × seq tokens (no padding), gradient clipping at 1.0 (the HF Trainer's default), AdamW, bf16
weights; step time taken with the GPU synchronized
at each step's end. Prints one JSON line.

    python scripts/hand_loop.py --arch llama-3.2-1b --batch 8 --seq 2048 --steps 30 --warmup 5 [--liger] [--cce]

--cce: the loss by Cut Cross-Entropy (`cut_cross_entropy.linear_cross_entropy` on the last hidden state and the
LM head's weight, its defaults, targets shifted by one), the model's own loss otherwise.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from finetune_bench.inputs.catalog import architecture_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    parser.add_argument("--liger", action="store_true", help="Liger's default kernels for the model type")
    parser.add_argument("--cce", action="store_true", help="the loss by Cut Cross-Entropy")
    opts = parser.parse_args()

    config_dict = architecture_config(opts.arch)
    config = AutoConfig.for_model(
        config_dict["model_type"], **{k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    )
    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if opts.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr)
    vocab = min(config.vocab_size, 8192)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    last = time.perf_counter()
    for _ in range(opts.steps):
        ids = torch.randint(3, vocab, (opts.batch, opts.seq), device=device)
        if opts.cce:
            from cut_cross_entropy import linear_cross_entropy

            hidden = model.model(input_ids=ids).last_hidden_state
            loss = linear_cross_entropy(hidden, model.lm_head.weight, ids, shift=True)
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if opts.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    measured = times[opts.warmup :]
    tokens = opts.batch * opts.seq
    print(
        json.dumps(
            {
                "arch": opts.arch,
                "liger": opts.liger,
                "cce": opts.cce,
                "batch": opts.batch,
                "max_grad_norm": opts.max_grad_norm,
                "seq": opts.seq,
                "tokens_per_second": tokens * len(measured) / sum(measured),
                "step_time_median_s": statistics.median(measured),
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 1024**3,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 1024**3,
                "step_times_s": [round(t, 4) for t in times],
                "gpu": torch.cuda.get_device_name(),
            }
        )
    )


if __name__ == "__main__":
    main()
