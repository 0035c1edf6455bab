"""A plain PyTorch training loop: forward with labels, backward, optimizer step. No Trainer.

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
from finetune_bench.backends.common import load_model
from finetune_bench.liger import loss_path
from finetune_bench.measure import StepRecorder
from finetune_bench.spec import TrainingArgs

IGNORE_INDEX = -100


def tokenize_prompt_completion(dataset, tokenizer, max_length: int):
    """input_ids and labels (prompt masked with -100), truncated to `max_length`."""

    def encode(row: dict) -> dict:
        if "text" in row and "prompt" not in row:
            ids = tokenizer(row["text"])["input_ids"] + [tokenizer.eos_token_id]
            return {"input_ids": ids[:max_length], "labels": ids[:max_length]}
        prompt = tokenizer(row["prompt"])["input_ids"]
        completion = tokenizer(row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        ids = (prompt + completion)[:max_length]
        labels = ([IGNORE_INDEX] * len(prompt) + completion)[:max_length]
        return {"input_ids": ids, "labels": labels}

    encoded = dataset.map(encode, remove_columns=dataset.column_names)
    # An example whose prompt fills the window has nothing to learn from.
    return encoded.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"]))


def collate(rows: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row of the batch."""
    longest = max(len(row["input_ids"]) for row in rows)
    input_ids = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = torch.tensor(row["labels"])
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


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
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        recorder.end_step()
        recorder.record_loss(step, float(step_loss))  # after end_step's sync: costs no extra wait
        faults.maybe_inject(step)

    return {
        "loss_path": loss_path(model),
        "liger_patches": loaded.liger_patches,
        "random_init": loaded.random_init,
        "attn_implementation": str(getattr(model.config, "_attn_implementation", "")),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
    }
