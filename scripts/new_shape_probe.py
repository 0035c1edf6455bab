"""Where a step that meets a new batch shape spends its extra time: a random-init model trained on padded batches whose
length changes, every step timed (GPU synchronized) and profiled on the host (cProfile), with Triton's compilations
and the CUDA caching allocator's cudaMalloc calls counted per step. Prints one JSON line: per step its length, whether
the length was new, its time, compilations and mallocs; and the host functions whose cumulative time differs most
between new-length and repeated-length steps (per step, new minus repeated).

    python scripts/new_shape_probe.py --arm liger --arch llama-3.2-1b --batch 8 --lengths 1024,1040,...
        [--repeats 2] [--warmup 3] [--pad-to-multiple-of N]

Each length of --lengths comes --repeats times, in a seeded random order after --warmup steps at the longest one.
"""

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import architecture_config


class CompileCounter:
    """Triton compilations (and their seconds) while installed: wraps `triton.compiler.compile`, which every
    `@triton.jit` kernel's first launch for a new specialisation calls (a disk-cache hit included)."""

    def __init__(self) -> None:
        self.count, self.seconds, self.names = 0, 0.0, []

    def install(self) -> None:
        import triton.compiler.compiler as compiler_module
        import triton.runtime.jit as jit_module

        original = compiler_module.compile

        def counted(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.count += 1
                self.seconds += time.perf_counter() - start
                source = args[0] if args else kwargs.get("src")
                self.names.append(getattr(getattr(source, "fn", None), "__name__", type(source).__name__))

        compiler_module.compile = counted
        for module in (jit_module,):
            if getattr(module, "compile", None) is original:
                module.compile = counted
        import triton

        if getattr(triton, "compile", None) is original:
            triton.compile = counted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="llama-3.2-1b")
    parser.add_argument("--arm", default="baseline")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", required=True, help="comma-separated padded lengths")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pad-to-multiple-of", type=int, default=0)
    parser.add_argument("--num-hidden-layers", type=int, default=0)
    parser.add_argument("--top", type=int, default=25)
    opts = parser.parse_args()
    arm = parse_arm(opts.arm)
    lengths = [int(n) for n in opts.lengths.split(",")]
    if opts.pad_to_multiple_of:
        m = opts.pad_to_multiple_of
        lengths = [-(-n // m) * m for n in lengths]
    order = lengths * opts.repeats
    random.Random(0).shuffle(order)
    order = [max(lengths)] * opts.warmup + order

    config_dict = architecture_config(opts.arch)
    if opts.num_hidden_layers:
        config_dict = {**config_dict, "num_hidden_layers": opts.num_hidden_layers}
    config = AutoConfig.for_model(
        config_dict["model_type"], **{k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    )
    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if arm.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model, **arm.liger_flags(config.model_type))
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    compiles = CompileCounter()
    compiles.install()
    masks = {"with_mask": 0, "without_mask": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted_sdpa(*args, **kwargs):
        # whether the attention call carries a mask: cuDNN's any-length plans (TORCH_CUDNN_SDPA_AVOID_RECOMPILE)
        # take none
        has_mask = (args[3] if len(args) > 3 else kwargs.get("attn_mask")) is not None
        masks["with_mask" if has_mask else "without_mask"] += 1
        return sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted_sdpa

    rows, seen = [], set()
    profiles: dict[bool, list[cProfile.Profile]] = {True: [], False: []}
    for index, length in enumerate(order):
        # a padded batch: each row's real length between 60 % of the batch length and all of it, the longest full
        ids = torch.randint(3, 8192, (opts.batch, length), device=device)
        real = torch.randint(int(0.6 * length), length + 1, (opts.batch,))
        real[0] = length
        mask = (torch.arange(length)[None, :] < real[:, None]).to(device=device, dtype=torch.long)
        labels = ids.masked_fill(mask == 0, -100)
        before = (compiles.count, compiles.seconds, torch.cuda.memory_stats(device).get("num_device_alloc", 0))
        profile = cProfile.Profile()
        torch.cuda.synchronize()
        start = time.perf_counter()
        profile.enable()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        profile.disable()
        seconds = time.perf_counter() - start
        new = length not in seen
        seen.add(length)
        rows.append(
            {
                "step": index + 1,
                "length": length,
                "new": new,
                "warmup": index < opts.warmup,
                "seconds": round(seconds, 4),
                "compiles": compiles.count - before[0],
                "compile_s": round(compiles.seconds - before[1], 4),
                "mallocs": torch.cuda.memory_stats(device).get("num_device_alloc", 0) - before[2],
            }
        )
        if index >= opts.warmup:
            profiles[new].append(profile)

    def per_step(kept: list[cProfile.Profile]) -> dict[str, float]:
        """Each host function's cumulative seconds per step, over the steps profiled in `kept`."""
        if not kept:
            return {}
        stats = pstats.Stats(kept[0])
        for profile in kept[1:]:
            stats.add(profile)
        return {
            f"{filename.rsplit('site-packages/', 1)[-1]}:{line}({name})": cumulative / len(kept)
            for (filename, line, name), (_, _, _, cumulative, _) in stats.stats.items()
        }

    new_cum, old_cum = per_step(profiles[True]), per_step(profiles[False])
    differences = sorted(
        ((new_cum.get(k, 0.0) - old_cum.get(k, 0.0), k) for k in set(new_cum) | set(old_cum)), reverse=True
    )
    timed = [r for r in rows if not r["warmup"]]
    new_times = [r["seconds"] for r in timed if r["new"]]
    old_times = [r["seconds"] for r in timed if not r["new"]]
    print(
        json.dumps(
            {
                "arm": arm.name,
                "arch": opts.arch,
                "batch": opts.batch,
                "pad_to_multiple_of": opts.pad_to_multiple_of,
                "distinct_lengths": len(set(lengths)),
                "new_step_median_s": statistics.median(new_times) if new_times else None,
                "repeated_step_median_s": statistics.median(old_times) if old_times else None,
                "compiles_in_new_steps": sum(r["compiles"] for r in timed if r["new"]),
                "compiles_in_repeated_steps": sum(r["compiles"] for r in timed if not r["new"]),
                "compiled_kernels": sorted(set(compiles.names)),
                "host_time_new_minus_repeated": [
                    {"s_per_step": round(d, 4), "function": k} for d, k in differences[: opts.top]
                ],
                "steps": rows,
                "attention_calls": masks,
                "any_length_switch": os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", ""),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
