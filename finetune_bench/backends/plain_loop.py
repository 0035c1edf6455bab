"""A plain PyTorch training loop: forward with labels, backward, gradient clipping (as the HF
Trainer does, `max_grad_norm`), optimizer step. No Trainer.

It shows what the Trainer's own machinery costs, and it is where Liger's fused linear cross
entropy is reachable: with Liger's defaults the model's forward computes the loss with
LigerFusedLinearCrossEntropy (no logits materialized); the baseline computes logits and
transformers' cross entropy.

Data are the same prompt/completion examples as the Trainer backends, tokenized the same way
(prompt + completion + EOS, truncated to max_seq_length, loss on completion tokens only), padded
per batch to the longest example.
"""

import itertools
from pathlib import Path

import torch

from finetune_bench import faults, sources
from finetune_bench.backends.common import load_model, run_details
from finetune_bench.backends.data import collate, tokenize_prompt_completion
from finetune_bench.liger import loss_path
from finetune_bench.measure import StepRecorder
from finetune_bench.spec import TrainingArgs


def build_optimizer(args: TrainingArgs, model: torch.nn.Module, work_dir: Path) -> torch.optim.Optimizer:
    """The optimizer the HF Trainer would build for `args.optim`, with the Trainer's weight-decay groups."""
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_pt_utils import get_parameter_names

    hf_args = TrainingArguments(
        output_dir=str(work_dir / "optimizer-args"),
        optim=args.optim,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        report_to="none",
        use_cpu=not any(p.is_cuda for p in model.parameters()),
    )
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(hf_args, model)
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm", "norm"]))
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in trainable if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in trainable if n not in decay], "weight_decay": 0.0},
    ]
    return optimizer_cls([g for g in groups if g["params"]], **optimizer_kwargs)


def train(
    args: TrainingArgs,
    dataset_dir: Path,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
) -> dict:
    from transformers import get_scheduler

    loaded = load_model(args, model_dir, device, dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    recorder.attach_model(model)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()

    data = tokenize_prompt_completion(sources.load_prompt_completion(dataset_dir), tokenizer, args.max_seq_length)
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        generator=generator,
        drop_last=True,
        collate_fn=lambda rows: collate(rows, tokenizer.pad_token_id),
        pin_memory=device.type == "cuda",
    )
    if len(loader) == 0:
        raise ValueError(
            f"the dataset has {len(data)} usable examples, fewer than one batch of {args.per_device_train_batch_size}"
        )
    batches = itertools.chain.from_iterable(itertools.repeat(loader))
    optimizer = build_optimizer(args, model, work_dir)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=int(args.warmup_ratio * args.max_steps),
        num_training_steps=args.max_steps,
    )

    recorder.begin_training()
    for step in range(1, args.max_steps + 1):
        step_loss = torch.zeros((), device=device)
        for _ in range(args.gradient_accumulation_steps):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            recorder.add_batch(batch["attention_mask"], batch["input_ids"])
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            step_loss += loss.detach()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        recorder.end_step()
        recorder.record_loss(step, float(step_loss))  # after end_step's sync: costs no extra wait
        faults.maybe_inject(step)

    return run_details(loaded, loss_path(model))
