"""Checks on the downloaded data and model, before any run is launched: a condition whose max_seq_length leaves no
example (or fewer than one batch) with a token to learn from, or whose model_config_overrides the downloaded model's
config refuses, would only fail on the GPU, run after run."""

import dataclasses
import json
from pathlib import Path

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import GIB
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.model_overrides import (
    check_overrides_against_config,
    config_known_at_planning,
    parse_config_overrides,
)
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.backends.data import NotOneBatch, packed_rows, require_one_batch, usable_examples


def cuts_rows(args: "TrainingArgs") -> bool:  # noqa: F821
    """Whether a run packs its examples' tokens into rows cut at max_seq_length (the plain loop's packing), so that it
    trains as many rows as those tokens fill."""
    return args.packing and args.backend == "plain_loop"


def refuse_unfillable(planned: list[PlannedRun], dataset_dir: Path, model_dir: Path) -> list[PlannedRun]:
    """`planned`, with every run whose dataset cannot fill one batch at its max_seq_length refused (it ends as
    an error result naming why, without being launched): every backend trains the examples whose prompt leaves room
    for a completion token (`usable_examples`). Packed, several examples share a row, and one example left is the
    least that trains with TRL (its rows are whole examples); the plain loop cuts its rows from the examples' tokens,
    and needs as many rows as one batch has examples."""
    checked = [run for run in planned if not (run.refused or run.predicted_oom)]
    if not checked:
        return planned
    from transformers import AutoTokenizer

    from finetune_bench.sources.datasets import load_prompt_completion, split_held_out

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = load_prompt_completion(dataset_dir)
    usable = {}  # (eval_examples, max_seq_length) → usable training examples once those are held out
    rows = {}  # the same → the rows the plain loop's packing cuts from them
    unsplittable = {}  # eval_examples → why they cannot be held out
    lengths = sorted({run.training_args.max_seq_length for run in checked})
    for held_out in sorted({run.training_args.eval_examples for run in checked}):
        try:
            training = split_held_out(dataset, held_out)[0]
        except ValueError as exc:
            unsplittable[held_out] = str(exc)
            continue
        for length, count in usable_examples(training, tokenizer, lengths).items():
            usable[held_out, length] = count
        cut = sorted({r.training_args.max_seq_length for r in checked if cuts_rows(r.training_args)})
        for length, count in packed_rows(training, tokenizer, cut).items():
            rows[held_out, length] = count
    refused = {}
    for run in checked:
        args = run.training_args
        batch = 1 if args.packing else args.examples_per_step
        try:
            if args.eval_examples in unsplittable:
                raise NotOneBatch(unsplittable[args.eval_examples])
            require_one_batch(usable[args.eval_examples, args.max_seq_length], batch, args.max_seq_length)
            if cuts_rows(args) and rows[args.eval_examples, args.max_seq_length] < args.examples_per_step:
                raise NotOneBatch(
                    f"packed into rows of max_seq_length {args.max_seq_length}, the dataset's "
                    f"{usable[args.eval_examples, args.max_seq_length]} usable examples make "
                    f"{rows[args.eval_examples, args.max_seq_length]} rows, fewer than one batch of "
                    f"{args.examples_per_step}: lower per_device_train_batch_size, or add data"
                )
        except NotOneBatch as exc:
            refused[id(run)] = f"not launched: {exc} (checked on the downloaded data before any run)"
    return [dataclasses.replace(run, refused=refused[id(run)]) if id(run) in refused else run for run in planned]


def refuse_invalid_overrides(planned: list[PlannedRun], model_dir: Path) -> list[PlannedRun]:
    """`planned`, with every run whose `model_config_overrides` the downloaded model's config refuses refused (it
    ends as an error result naming why, without being launched). Only a model whose config planning could not read
    (a hub id) is checked here: planning checked the others against their config."""
    config = None
    refusals: dict[str, str] = {}  # overrides → why refused ("" when they hold)
    for run in planned:
        args = run.training_args
        overrides = args.model_config_overrides
        if run.refused or overrides in refusals or not parse_config_overrides(overrides):
            continue
        if config_known_at_planning(args.model_name) is not None:
            refusals[overrides] = ""
            continue
        if config is None:
            config = json.loads((Path(model_dir) / "config.json").read_text())
        try:
            check_overrides_against_config(args.model_name, config, parse_config_overrides(overrides))
            refusals[overrides] = ""
        except SpecError as exc:
            refusals[overrides] = "; ".join(exc.problems)
    return [
        dataclasses.replace(
            run, refused=f"not launched: {why} (checked on the downloaded model's config before any run)"
        )
        if not run.refused and (why := refusals.get(run.training_args.model_config_overrides))
        else run
        for run in planned
    ]


def machine_problems(conditions: list[TrainingArgs], gpu_names: list[str], gpu_memory_bytes: float | None) -> list[str]:
    """What could only fail on a machine with `gpu_names` (and that much memory on its first GPU): a condition on more
    GPUs than it has, one that asks for a GPU where there is none (float8, the CUDA allocator's options, a memory cap
    with device 'auto' train on the CPU there), or a memory cap above its GPU's memory; each problem once, in order."""
    names, memory = gpu_names, gpu_memory_bytes
    here = f"this machine has {len(names)} GPU(s)" + (f" ({names[0]})" if names else "")
    problems: dict[str, None] = {}  # in order, each once
    for t in conditions:
        if t.device == "cpu":
            continue
        if not names and t.device == "cuda":
            problems["training_args.device 'cuda': no NVIDIA GPU is visible on this machine; set device 'cpu'"] = None
        if not names and t.device == "auto" and parse_arm(t.arm).float8:
            problems[
                f"arm {t.arm!r}: float8 training needs a CUDA GPU and no NVIDIA GPU is visible on this "
                "machine (device 'auto' trains on the CPU here, where its matmuls are refused); leave float8 out here"
            ] = None
        if not names and t.device == "auto" and t.allocator != "default":
            problems[
                f"training_args.allocator {t.allocator!r}: it configures PyTorch's CUDA caching allocator, and no "
                "NVIDIA GPU is visible on this machine (device 'auto' trains on the CPU here); use allocator 'default'"
            ] = None
        if not names and t.gpu_memory_cap_gib:
            problems[
                f"training_args.gpu_memory_cap_gib {t.gpu_memory_cap_gib:g}: no NVIDIA GPU is visible on this machine, "
                "so the run trains on the CPU, where a cap caps nothing; leave it 0"
            ] = None
        if names and t.num_gpus > len(names):
            problems[
                f"training_args.num_gpus {t.num_gpus}: {here}, and a run on {t.num_gpus} would wait for GPUs that "
                f"never come; set num_gpus to at most {len(names)}, or run it on a cluster (union run --remote)"
            ] = None
        if memory and t.gpu_memory_cap_gib * GIB > memory:
            problems[memory_cap_above(t.gpu_memory_cap_gib, memory, names[0] if names else "this machine's GPU")] = None
    return list(problems)


def memory_cap_above(cap_gib: float, memory_bytes: float, gpu: str) -> str:
    """The problem of a `gpu_memory_cap_gib` above the GPU's memory."""
    return (
        f"training_args.gpu_memory_cap_gib {cap_gib:g} is above the memory of {gpu} ({memory_bytes / GIB:.1f} "
        "GiB): a cap emulates a smaller GPU; set it to at most that, or 0 for the whole GPU"
    )


def check_cap_fits_target(conditions: list[TrainingArgs], target: "Target") -> None:  # noqa: F821
    """A `gpu_memory_cap_gib` above the memory of the GPU the plan targets (its kind, or the accelerator's)."""
    if not target.memory_bytes:
        return
    for cap in dict.fromkeys(t.gpu_memory_cap_gib for t in conditions):
        if cap * GIB > target.memory_bytes:
            raise SpecError(memory_cap_above(cap, target.memory_bytes, target.name or "the target GPU"))
