"""A minimal hand-written training loop, the yardstick for the plain-loop backend's overhead.

Random-init causal LM from a bundled architecture config, random token batches of exactly
batch × seq tokens (no padding), gradient clipping at 1.0 (the HF Trainer's default), AdamW, bf16
weights (`--fused`: fused AdamW, as `optim: adamw_torch_fused`); step time taken with the GPU synchronized
at each step's end. Prints one JSON line.

    python scripts/hand_loop.py --arch llama-3.2-1b --batch 8 --seq 2048 --steps 30 --warmup 5 [--arm ARM]
        [--num-hidden-layers N] [--fused] [--profile-dir DIR [--profile-steps N]] [--synthetic-text]
        [--token-ids-below N] [--masked-prompt-tokens N] [--gradient-checkpointing] [--device cpu]
        [--memory-cap-gib GIB]

`--memory-cap-gib`: each GPU as one of that many GiB (as the inputs' `gpu_memory_cap_gib`); a rank that runs out of
memory prints a line with `"status": "oom"`, where it ran out, and exits (torchrun then ends the other ranks).

`--device cpu` checks that the loop runs (gloo between ranks, no memory figures; tests/running/test_hand_loop.py):
its step times are no figure.

On several GPUs, under torchrun (one process per GPU; `--batch` is per GPU, each rank draws its own tokens):

    torchrun --nproc-per-node 2 scripts/hand_loop.py --parallelism ddp [--bucket-cap-mb 25]
        [--gradient-as-bucket-view] ...
    torchrun --nproc-per-node 4 scripts/hand_loop.py --parallelism fsdp --arch llama-3-8b ...

`ddp`: DistributedDataParallel with its defaults but `broadcast_buffers=False` (as the benchmark wraps it; bucket
size `--bucket-cap-mb`, gradients as bucket views with `--gradient-as-bucket-view`); `fsdp`: FSDP2's `fully_shard`
on each decoder layer, then on the model. Rank 0 prints the JSON line, its throughput that of all GPUs (every rank's
tokens over rank 0's time: the ranks step together).

--arm: an arm as the benchmark's inputs name it (`baseline`, `liger`, `liger-without-loss+cce`, `float8+compile`,
...), each component switched on the way a user's own loop would: Liger's patch function for the model type with
the arm's switches; the loss by Cut Cross-Entropy (`cut_cross_entropy.linear_cross_entropy` on the last hidden
state and the LM head's weight, its defaults, targets shifted by one), the model's own loss otherwise; torchao's
`convert_to_float8_training` (the LM head left out; under FSDP2 its float8 all-gather); `model.compile()` (the
decoder's, when the loss starts from its hidden states). `--liger` and `--cce` are short for those arms. A
compiled arm's line says what dynamo made of it (`compile_graphs`, `compile_graph_breaks` and their reasons).
"""

import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import architecture_config
from finetune_bench.running.backends.common import compile_details, enable_activation_checkpointing


def synthetic_rows(seq: int, vocab_size: int, num_examples: int = 512) -> torch.Tensor:
    """The first `seq` tokens of each generated alpaca example long enough to fill them, as the benchmark's
    `synthetic:alpaca` data (2,100-2,600 words an example) is tokenized for a `random:` model."""
    from finetune_bench.inputs.catalog import OFFLINE_TOKENIZER_VOCAB
    from finetune_bench.sources.synthetic import generate_alpaca_records, train_offline_tokenizer

    tokenizer = train_offline_tokenizer(min(OFFLINE_TOKENIZER_VOCAB, vocab_size))
    texts = [
        " ".join(r[k] for k in ("instruction", "input", "output"))
        for r in generate_alpaca_records(num_examples, 2100, 2600)
    ]
    ids = [row[:seq] for row in tokenizer(texts)["input_ids"] if len(row) >= seq]
    if not ids:
        raise SystemExit(f"no generated example has {seq} tokens")
    return torch.tensor(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    parser.add_argument("--arm", default="", help="an arm of the benchmark's grammar")
    parser.add_argument("--liger", action="store_true", help="Liger's default kernels for the model type")
    parser.add_argument("--cce", action="store_true", help="the loss by Cut Cross-Entropy")
    parser.add_argument("--fused", action="store_true", help="fused AdamW (the inputs' optim adamw_torch_fused)")
    parser.add_argument("--num-hidden-layers", type=int, default=0, help="the architecture with this many layers")
    parser.add_argument(
        "--profile-dir",
        default="",
        help="after the timed steps, profile --profile-steps more steps into this folder "
        "(the benchmark's own profiler: kernel table, trace, memory snapshot), to compare with a profiled run's",
    )
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument(
        "--synthetic-text",
        action="store_true",
        help="the batches from the benchmark's generated text (`synthetic:alpaca`, 2,100-2,600 words an example) "
        "tokenized by the tokenizer a `random:` model gets, every row full: the token statistics of the workflow's "
        "runs, which data-dependent kernels (Cut Cross-Entropy's backward) are sensitive to",
    )
    parser.add_argument(
        "--token-ids-below",
        type=int,
        default=8192,
        help="draw the random token ids from [3, N) (0: the model's whole vocabulary)",
    )
    parser.add_argument(
        "--masked-prompt-tokens",
        type=int,
        default=0,
        help="pass an attention mask (all ones) and leave the loss off the first N tokens of every row (-100 labels), "
        "as the benchmark's plain loop does with prompt/completion examples",
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a check that the loop runs (gloo between ranks, no memory figures), never a figure",
    )
    parser.add_argument("--parallelism", choices=("none", "ddp", "fsdp"), default="none")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size (its default)")
    parser.add_argument(
        "--gradient-as-bucket-view", action="store_true", help="DDP keeps each gradient inside its bucket (no copy)"
    )
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        default=0.0,
        help="run as if each GPU had this many GiB (the inputs' gpu_memory_cap_gib; 0: the whole GPU)",
    )
    opts = parser.parse_args()
    arm = parse_arm(
        opts.arm or "+".join(name for name, on in (("liger", opts.liger), ("cce", opts.cce)) if on) or "baseline"
    )

    if arm.cce and opts.parallelism == "ddp":
        raise SystemExit("--parallelism ddp with Cut Cross-Entropy: its loss calls the decoder past DDP's forward")
    config_dict = architecture_config(opts.arch)
    if opts.num_hidden_layers:
        config_dict = {**config_dict, "num_hidden_layers": opts.num_hidden_layers}
    config = AutoConfig.for_model(
        config_dict["model_type"], **{k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    )
    cuda = opts.device == "cuda"
    device = torch.device(opts.device)
    rank, world_size = 0, 1
    if opts.parallelism != "none":
        import os

        import torch.distributed as dist

        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if cuda:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    if cuda and opts.memory_cap_gib:
        from finetune_bench.running.allocator import cap_memory

        cap_memory(device, opts.memory_cap_gib)
    torch.manual_seed(0)  # the same initial weights on every rank
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if opts.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if arm.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model, **arm.liger_flags(config.model_type))
    if arm.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        # under FSDP2, torchao's recipe: weights all-gathered in float8, their scales computed after each step
        float8_config = Float8LinearConfig(enable_fsdp_float8_all_gather=opts.parallelism == "fsdp")
        convert_to_float8_training(model, config=float8_config, module_filter_fn=lambda module, fqn: fqn != "lm_head")
    if arm.compile:
        if arm.liger:  # Liger's kernels traced by dynamo give wrong losses
            from finetune_bench.running.liger_patching import keep_liger_out_of_compiled_graphs

            keep_liger_out_of_compiled_graphs()
        (model.model if arm.cce else model).compile()
    model.config.use_cache = False
    model.train()
    trained = model
    if opts.parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(
            model,
            device_ids=[device.index] if cuda else None,
            broadcast_buffers=False,
            bucket_cap_mb=opts.bucket_cap_mb,
            gradient_as_bucket_view=opts.gradient_as_bucket_view,
        )
    elif opts.parallelism == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    torch.manual_seed(1 + rank)  # each rank its own tokens
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, fused=opts.fused or None)
    vocab = min(config.vocab_size, opts.token_ids_below or config.vocab_size)
    rows = synthetic_rows(opts.seq, config.vocab_size).to(device) if opts.synthetic_text else None

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []

    def step() -> None:
        if rows is None:
            ids = torch.randint(3, vocab, (opts.batch, opts.seq), device=device)
        else:
            ids = rows[torch.randint(0, len(rows), (opts.batch,), device=device)]
        labels = ids.clone()
        labels[:, : opts.masked_prompt_tokens] = -100
        if arm.cce:
            from cut_cross_entropy import linear_cross_entropy

            hidden = model.model(input_ids=ids).last_hidden_state
            loss = linear_cross_entropy(hidden, model.lm_head.weight, labels, shift=True)
        elif opts.masked_prompt_tokens:
            loss = trained(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        else:
            loss = trained(input_ids=ids, labels=ids).loss
        loss.backward()
        if opts.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if arm.float8 and opts.parallelism == "fsdp":
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)

    last = time.perf_counter()
    try:
        for _ in range(opts.steps):
            step()
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - last)
            last = now
    except torch.OutOfMemoryError as exc:  # this rank's line says where it ran out; its exit ends the other ranks
        reserved = torch.cuda.max_memory_reserved() / 1024**3 if cuda else None
        line = {"status": "oom", "rank": rank, "step": len(times) + 1, "arm": arm.name, "batch": opts.batch}
        line.update(seq=opts.seq, memory_cap_gib=opts.memory_cap_gib, peak_reserved_gib=reserved)
        print(json.dumps({**line, "error": str(exc).strip().splitlines()[0]}), flush=True)
        import os

        os._exit(1)
    measured = times[opts.warmup :]
    peak_allocated = torch.cuda.max_memory_allocated() if cuda else None
    peak_reserved = torch.cuda.max_memory_reserved() if cuda else None
    if opts.profile_dir:
        from pathlib import Path

        from finetune_bench.measuring.profiling import profile_steps

        # one folder a rank under torchrun
        out_dir = Path(opts.profile_dir) / (f"rank{rank}" if opts.parallelism != "none" else "")
        profile_steps(step, opts.profile_steps, device, out_dir)
    tokens = opts.batch * opts.seq * world_size
    if opts.parallelism != "none":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if rank != 0:
        return
    print(
        json.dumps(
            {
                "status": "ok",
                "arch": opts.arch,
                "arm": arm.name,
                "memory_cap_gib": opts.memory_cap_gib,
                "num_hidden_layers": config.num_hidden_layers,
                "fused_adamw": opts.fused,
                "masked_prompt_tokens": opts.masked_prompt_tokens,
                "token_ids_below": None if opts.synthetic_text else vocab,
                "synthetic_text": opts.synthetic_text,
                "batch": opts.batch,
                "max_grad_norm": opts.max_grad_norm,
                "seq": opts.seq,
                "parallelism": opts.parallelism,
                "world_size": world_size,
                "bucket_cap_mb": opts.bucket_cap_mb if opts.parallelism == "ddp" else None,
                "gradient_as_bucket_view": opts.gradient_as_bucket_view if opts.parallelism == "ddp" else None,
                "gradient_checkpointing": opts.gradient_checkpointing,
                **(compile_details() if arm.compile else {}),
                "tokens_per_second": tokens * len(measured) / sum(measured),
                "tokens_per_second_per_gpu": tokens * len(measured) / sum(measured) / world_size,
                "step_time_median_s": statistics.median(measured),
                "peak_allocated_gib": peak_allocated / 1024**3 if cuda else None,
                "peak_reserved_gib": peak_reserved / 1024**3 if cuda else None,
                "step_times_s": [round(t, 4) for t in times],
                "gpu": torch.cuda.get_device_name() if cuda else "cpu",
                # what decides, e.g., whether compile reaches checkpointed layers under FSDP2 (transformers 5.23 on)
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
