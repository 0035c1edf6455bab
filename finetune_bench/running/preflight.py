"""Checks on the downloaded data and model, before any run is launched: a condition whose max_seq_length leaves no
example (or fewer than one batch) with a token to learn from, or whose model_config_overrides the downloaded model's
config refuses, would only fail on the GPU, run after run."""

import dataclasses
import json
from pathlib import Path

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.model_overrides import (
    check_overrides_against_config,
    config_known_at_planning,
    parse_config_overrides,
)
from finetune_bench.inputs.plan import PlannedRun
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
