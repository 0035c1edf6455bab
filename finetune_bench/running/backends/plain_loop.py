"""A plain PyTorch training loop: forward, loss, backward, gradient clipping (as the HF Trainer
does, `max_grad_norm`), optimizer step. No Trainer.

It shows what the Trainer's own machinery costs. With `criterion: model` the model's forward
computes the loss from the labels: Liger's fused linear cross entropy (no logits materialized) in a
liger arm, transformers' cross entropy on the logits in the baseline. The other criteria are
computed here, whatever the arm: torch's cross entropy or Liger's on the logits, or Liger's fused
linear cross entropy or Apple's Cut Cross-Entropy (`cce`, also the arm component of that name) on the last
hidden states and the LM head's weight.

Cut Cross-Entropy runs its Triton kernels (`impl="cce"`) on a CUDA device; elsewhere its `torch_compile`
implementation (the logits materialized by a compiled graph: right losses, none of CCE's memory savings). The run
records which ran in `cce_implementation`.

Data are the same prompt/completion examples as the Trainer backends, tokenized the same way
(prompt + completion + EOS, truncated to max_seq_length, loss on completion tokens only), padded
per batch to the longest example; with `packing`, concatenated into rows of exactly max_seq_length
tokens whose position_ids restart at every example (`backends.data.pack`).

`dtype: float16` trains in mixed precision (`mixed_precision.LossScaling`; `common.trains_mixed_float16`), the
held-out evaluations under its autocast too. Two losses change form under it, to the same value:
- Liger's fused linear cross entropy (`criterion: liger_fused_linear_cross_entropy`, or the model's own loss in a liger
  arm) computes its gradients in the forward pass, before the loss is scaled. As a mean it divides them by the
  batch's labelled tokens there, in float16, where most of them (a probability below about 6e-8 times the token
  count) round to zero; so it is computed as a sum divided by the token count afterwards, as transformers' Trainer
  computes it (`num_items_in_batch`), and its float16 gradients are the unscaled (p - y).
- Liger's cross entropy on the logits (`criterion: liger_cross_entropy`) takes them in float32, as transformers' loss
  hands them to it: it writes its gradient into its input, in float16 it would lose the small ones the same way,
  and its loss would be float16 (which a loss scale of 65,536 overflows).
Cut Cross-Entropy takes the hidden states and the LM head's weight cast to float16, as autocast casts a matmul's
operands (its kernels take 16-bit inputs).
"""

import contextlib
import itertools
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

# At import, not in `train`: the worker counts them in the run's `imports_s`, not in its other phases.
from transformers import Trainer, TrainingArguments, get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.loss_paths import CCE_CRITERION, CUT_CROSS_ENTROPY, LIGER_FUSED, LossPath
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running import faults
from finetune_bench.running.backends.common import (
    LoadedModel,
    enable_activation_checkpointing,
    load_model,
    profile_after_timed_steps,
    run_details,
    trains_mixed_float16,
)
from finetune_bench.running.backends.data import (
    IGNORE_INDEX,
    check_packing_isolates_examples,
    collate,
    collate_packed,
    pack,
    require_one_batch,
    tokenize_prompt_completion,
    training_row_lengths,
)
from finetune_bench.running.backends.evaluation import HeldOutEvaluator
from finetune_bench.running.backends.mixed_precision import LossScaling, check_float16_parallelism
from finetune_bench.running.backends.shape_probes import probe_new_shapes
from finetune_bench.running.distributed import TrainingModule, gradient_sync, rank_sampler, share_model, unshared
from finetune_bench.running.float8 import precompute_float8_scales
from finetune_bench.running.liger_patching import loss_path, unwrap_peft
from finetune_bench.sources.datasets import load_training_and_held_out

if TYPE_CHECKING:
    import datasets


def build_optimizer(args: TrainingArgs, model: torch.nn.Module, work_dir: Path) -> torch.optim.Optimizer:
    """The optimizer the HF Trainer would build for `args.optim`, with the Trainer's weight-decay groups."""
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


LossFunction = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def training_batches(
    data: "datasets.Dataset", args: TrainingArgs, collate_rows: Callable, pin_memory: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `per_device_train_batch_size` rows, reshuffled every epoch (seeded), without end; on several
    GPUs each rank gets its own share of every epoch (a DistributedSampler).

    With `pin_memory` (a GPU trains) one loader process reads and pads the next batches while the GPU runs a step.
    Read and padded here, after each step's synchronization, they left the GPU idle at every step's start (padding
    8 rows of 2,048 tokens alone takes 5 ms of a CPU core): the plain loop ran at 0.92-0.98 of a hand-written loop's
    tokens/s on an H100, and at 1.007-1.018 with the loader process (docs/measurements.md)."""
    prefetch = {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2} if pin_memory else {}
    # The order is the sampler's alone: the loader draws its workers' seeds from a generator of its own (a loader
    # process draws once, this process once per epoch), never from the sampler's or the global one (dropout's).
    loader_seeds = torch.Generator().manual_seed(args.seed)
    if args.world_size == 1:
        loader = torch.utils.data.DataLoader(
            data,
            batch_size=args.per_device_train_batch_size,
            sampler=torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(args.seed)),
            generator=loader_seeds,
            drop_last=True,
            collate_fn=collate_rows,
            pin_memory=pin_memory,
            **prefetch,
        )
        yield from itertools.chain.from_iterable(itertools.repeat(loader))
        return
    sampler = rank_sampler(len(data), args.seed)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=args.per_device_train_batch_size,
        sampler=sampler,
        generator=loader_seeds,
        drop_last=True,
        collate_fn=collate_rows,
        pin_memory=pin_memory,
        **prefetch,
    )
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def batches_of(
    data: "datasets.Dataset", index_lists: list[list[int]], collate_rows: Callable, pin_memory: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """The batches of these rows (each a list of row indices), in order, read and padded as `training_batches`
    reads the training steps' (with `pin_memory`, by one loader process ahead of the GPU): the new-shape probes'."""
    prefetch = {"num_workers": 1, "prefetch_factor": 2} if pin_memory else {}
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=index_lists, collate_fn=collate_rows, pin_memory=pin_memory, **prefetch
    )
    return iter(loader)


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position predicts (the next token's), flattened, as transformers shifts them."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].reshape(-1)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the model's forward takes besides the labels: the attention mask of a padded batch, or the
    position_ids of a packed one (which must reach the model without an attention mask)."""
    return {k: v for k, v in batch.items() if k != "labels"}


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder without its LM head (`model.model` for Llama): what returns the last hidden states."""
    return getattr(model, model.base_model_prefix)


def last_hidden_states(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The decoder's output for the batch (batch, sequence, hidden), before the LM head: no logits computed."""
    return backbone(model)(**model_inputs(batch)).last_hidden_state


def cce_implementation(device: torch.device) -> str:
    """The implementation of `cut_cross_entropy.linear_cross_entropy` that runs on `device`: its Triton kernels on
    a CUDA GPU, its `torch_compile` one elsewhere (the Triton kernels do not run under the Triton interpreter)."""
    return "cce" if device.type == "cuda" else "torch_compile"


def autocast_operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`tensors` cast to autocast's dtype where autocast is on for their device, as it casts a matmul's operands (a
    differentiable cast: the gradient reaches a float32 master weight through it); as they are elsewhere. For the
    losses whose kernels autocast does not see (Cut Cross-Entropy's Triton kernels)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) for t in tensors)


def cut_cross_entropy_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    reduction: str = "mean",
    loss_phase: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> torch.Tensor:
    """Cut Cross-Entropy's loss of the batch from the decoder's last hidden states and the LM head's weight (the
    logits never whole in memory): the mean over the labelled tokens, or with `reduction: sum` their sum. A LoRA
    model (peft's wrapper) is called inside the wrapper, its adapters in place. Under autocast (float16 mixed
    precision: float32 hidden states and weight) both are cast to autocast's dtype first. The loss itself runs
    inside `loss_phase()` (the recorder's memory phase of the loss)."""
    from cut_cross_entropy import linear_cross_entropy

    model = unwrap_peft(model)
    hidden = last_hidden_states(model, batch)
    lm_head = model.get_output_embeddings()
    if lm_head.bias is not None:
        raise ValueError(
            f"Cut Cross-Entropy ({CCE_CRITERION!r}) takes no LM-head bias, and this model's LM head has one; its loss "
            "would be wrong"
        )
    # shift=True: position i predicts the label at i + 1, as transformers (and `next_token_labels`) shift;
    # IGNORE_INDEX skipped.
    hidden, weight = autocast_operands(hidden, lm_head.weight)
    with loss_phase():
        return linear_cross_entropy(
            hidden,
            weight,
            batch["labels"],
            ignore_index=IGNORE_INDEX,
            softcap=getattr(model.config, "final_logit_softcapping", None),
            reduction=reduction,
            shift=True,
            impl=cce_implementation(hidden.device),
        )


def labelled_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """How many positions of the batch have a label to predict (the tokens a mean loss averages over)."""
    return (next_token_labels(batch["labels"]) != IGNORE_INDEX).sum()


def loss_function(
    criterion: str,
    mixed_float16: bool = False,
    loss_phase: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> LossFunction:
    """The mean loss over the batch's labelled tokens, computed as `criterion` says. `mixed_float16`: the run trains
    in float16 mixed precision, and Liger's losses take the form that keeps their gradients in float16's range (the
    module's docstring says why): the same loss. Where the loss is computed apart from the model's forward (from its
    logits or its last hidden states), that part runs inside `loss_phase()` (the recorder's memory phase of the
    loss); the model's own loss is part of its forward."""
    if criterion == "model":
        if mixed_float16:  # the model's loss a sum over the tokens, divided by their count, as the Trainer asks
            return lambda model, batch: model(**batch, num_items_in_batch=labelled_tokens(batch)).loss
        return lambda model, batch: model(**batch).loss
    if criterion == "liger_fused_linear_cross_entropy":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        softcap_of = lambda model: getattr(model.config, "final_logit_softcapping", None)  # noqa: E731

        def fused(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            hidden = last_hidden_states(model, batch)
            hidden = hidden.reshape(-1, hidden.shape[-1])
            lm_head = model.get_output_embeddings()
            labels = next_token_labels(batch["labels"])
            with loss_phase():
                if mixed_float16:
                    loss = LigerFusedLinearCrossEntropyLoss(softcap=softcap_of(model), reduction="sum")
                    return loss(lm_head.weight, hidden, labels, lm_head.bias) / (labels != IGNORE_INDEX).sum()
                loss = LigerFusedLinearCrossEntropyLoss(softcap=softcap_of(model))
                return loss(lm_head.weight, hidden, labels, lm_head.bias)

        return fused
    if criterion == CCE_CRITERION:
        return partial(cut_cross_entropy_loss, loss_phase=loss_phase)
    if criterion == "liger_cross_entropy":
        from liger_kernel.transformers import LigerCrossEntropyLoss

        liger_cross_entropy = LigerCrossEntropyLoss()

        def on_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            # in float32 under float16 mixed precision, as transformers' loss hands the logits to it
            return liger_cross_entropy(logits.float() if mixed_float16 else logits, labels)

    elif criterion == "torch_cross_entropy":

        def on_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            # in float32, as transformers computes its loss
            return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)

    else:
        raise ValueError(f"the plain loop has no criterion {criterion!r}")

    def from_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(**model_inputs(batch)).logits
        with loss_phase():
            return on_logits(logits.reshape(-1, logits.shape[-1]), next_token_labels(batch["labels"]))

    return from_logits


def load_for_criterion(
    args: TrainingArgs, model_dir: Path, device: torch.device, dtype: torch.dtype
) -> tuple[LoadedModel, LossPath]:
    """The model, and the loss path it takes (its `criterion` is what `loss_function` computes): with `model` the
    model's forward computes the loss; with any other criterion, or the arm's `cce` component, that is the loss, so
    a liger arm must not swap in a second one. A compiled arm whose loss starts from the last hidden states calls
    the decoder directly, not the compiled model: the decoder is compiled too."""
    arm = parse_arm(args.arm)
    criterion = arm.loss_criterion(args.criterion)
    if criterion == "model":
        loaded = load_model(args, model_dir, device, dtype)
    else:
        loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
    path = loss_path(loaded.model, criterion)
    if arm.compile and criterion != "model" and path.kernel in (LIGER_FUSED, CUT_CROSS_ENTROPY):
        backbone(loaded.model).compile()
    return loaded, path


def loss_details(path: LossPath, device: torch.device) -> dict[str, str]:
    """What a run records about its loss beyond the path's name: which implementation of Cut Cross-Entropy ran."""
    return {"cce_implementation": cce_implementation(device)} if path.kernel == CUT_CROSS_ENTROPY else {}


def train(
    args: TrainingArgs,
    dataset_dir: Path,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
) -> dict:
    mixed_float16 = trains_mixed_float16(args, dtype)
    check_float16_parallelism(args, mixed_float16)
    with recorder.phase("model_init_s"):
        loaded, path = load_for_criterion(args, model_dir, device, dtype)
        model, tokenizer = loaded.model, loaded.tokenizer
        recorder.attach_model(model)
        if args.gradient_checkpointing:
            enable_activation_checkpointing(model)
        model.config.use_cache = False
        model.train()
        # On several GPUs the model and its loss are one module, shared over the ranks (DDP or FSDP2).
        loss_phase = partial(recorder.memory_phase, "loss")
        trained = TrainingModule(model, loss_function(path.criterion, mixed_float16, loss_phase))
        if args.world_size > 1:
            trained = share_model(trained, args, device)

    with recorder.phase("data_s"):
        training, held_out = load_training_and_held_out(dataset_dir, args.eval_examples)
        evaluator = HeldOutEvaluator(args, held_out, tokenizer, device, recorder)
        data = tokenize_prompt_completion(training, tokenizer, args.max_seq_length)
        if args.packing:
            check_packing_isolates_examples(model)
            data = pack(data, args.max_seq_length)
            collate_rows = collate_packed
        else:
            collate_rows = partial(
                collate, pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=args.pad_to_multiple_of
            )
        require_one_batch(len(data), args.examples_per_step, args.max_seq_length)
        row_lengths = training_row_lengths(data)
        recorder.record_row_lengths(row_lengths)
        batches = training_batches(data, args, collate_rows, pin_memory=device.type == "cuda")
    optimizer = build_optimizer(args, model, work_dir)  # after sharding: FSDP's parameters are the shards
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=int(args.warmup_ratio * args.max_steps),
        num_training_steps=args.max_steps,
    )
    scaling = LossScaling(device, mixed_float16, optimizer)

    def optimizer_step(record: bool, rows: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """One optimizer step over `gradient_accumulation_steps` micro-batches (the loader's, or `rows` each time);
        its loss. `record`: the recorder counts its tokens (a timed step)."""
        step_loss = torch.zeros((), device=device)
        for micro_batch in range(args.gradient_accumulation_steps):
            batch = {k: v.to(device, non_blocking=True) for k, v in (rows or next(batches)).items()}
            if record:
                recorder.add_batch(batch.get("attention_mask"), batch["input_ids"])
            with gradient_sync(trained, sync=micro_batch == args.gradient_accumulation_steps - 1):
                with scaling.autocast(), recorder.memory_phase("forward"):
                    loss = trained(batch) / args.gradient_accumulation_steps
                with recorder.memory_phase("backward"):
                    scaling.backward(loss)
            step_loss += loss.detach()
        with recorder.memory_phase("optimizer"):
            if scaling.step(optimizer, model.parameters(), args.max_grad_norm):
                scheduler.step()  # a step the scaler skipped leaves the learning rate where it was, as the Trainer does
            optimizer.zero_grad(set_to_none=True)
            if loaded.float8_all_gather:  # the updated weights' scales for the next step's float8 all-gather
                precompute_float8_scales(trained)
        return step_loss

    def evaluate(step: int) -> None:
        with scaling.autocast():  # in the precision it trains in
            evaluator.maybe_evaluate(evaluated, step)

    # on several GPUs every rank evaluates, through the shared module (an FSDP forward needs every rank)
    evaluated = unshared(trained) if args.world_size > 1 else model
    evaluate(0)
    recorder.begin_training()
    for step in range(1, args.max_steps + 1):
        step_loss = optimizer_step(record=True)
        recorder.end_step()
        recorder.record_loss(step, float(step_loss))  # after end_step's sync: costs no extra wait
        faults.maybe_inject(step, model)
        evaluate(step)
    scaled = scaling.details(model)  # of the training steps, before any profiled one
    recorder.end_training()  # what follows is no training step: nothing of it is counted
    probed = {}
    if args.new_shape_probes and device.type != "cpu" and not args.packing:
        with recorder.phase("shape_probes_s"):
            probed = probe_new_shapes(
                args,
                row_lengths,
                recorder.shapes_fed,
                partial(batches_of, data, collate_rows=collate_rows, pin_memory=device.type == "cuda"),
                partial(optimizer_step, False),
                device,
            )
    profiled = profile_after_timed_steps(
        args, recorder, lambda: optimizer_step(record=False), device, work_dir
    )  # a failure: a detail

    return {**run_details(loaded, path), **loss_details(path, device), **scaled, **probed, **profiled}
