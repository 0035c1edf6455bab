"""Inside one rank's training child (a run on several GPUs, `running.ranks`): its device, its process group, and
how the plain loop shares the model over the ranks (DDP or FSDP2). The Trainer backends share it through
accelerate (`backends.trainer_common`).
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from finetune_bench.inputs.settings import TrainingArgs


def rank_device(device: torch.device) -> torch.device:
    """This rank's own device: its local rank's GPU (made the current one), or the CPU."""
    if device.type != "cuda":
        return device
    local_rank = int(os.environ["LOCAL_RANK"])
    visible = torch.cuda.device_count()
    if local_rank >= visible:
        raise RuntimeError(f"this rank trains on GPU {local_rank}, and only {visible} GPU(s) are visible")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def start_process_group(device: torch.device, collective_timeout_s: float, namespace: str = "") -> None:
    """Join the run's process group (NCCL on GPUs, gloo on CPUs) through the launch's store (env://; with
    `namespace`, under that prefix of it: one of several runs of one launch, whose groups' keys must not meet); a
    collective that waits longer than `collective_timeout_s` raises."""
    cuda = device.type == "cuda"
    timeout = timedelta(seconds=collective_timeout_s)
    where: dict = {}
    if namespace:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout,
            wait_for_workers=False,
        )  # fmt: skip
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        where = {"store": dist.PrefixStore(f"process_group/{namespace}", store), "rank": rank, "world_size": world_size}
    dist.init_process_group(
        backend="nccl" if cuda else "gloo", timeout=timeout, device_id=device if cuda else None, **where
    )


def end_process_group() -> None:
    """Leave the process group once every rank has finished (a barrier first, so that no rank tears its side
    down while a peer still needs it)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class TrainingModule(torch.nn.Module):
    """The model and its loss as one module, so that DDP and FSDP see every forward the training does: called
    with a batch it returns the loss (`compute_loss(model, batch)`, which may call parts of the model, as the
    fused loss does); called with the model's own keyword arguments, the model's output (the evaluation)."""

    def __init__(self, model: torch.nn.Module, compute_loss: Callable[[torch.nn.Module, dict], torch.Tensor]):
        super().__init__()
        self.model = model
        self.compute_loss = compute_loss

    def forward(self, batch: dict[str, torch.Tensor] | None = None, **model_kwargs: object) -> object:
        if batch is not None:
            return self.compute_loss(self.model, batch)
        from finetune_bench.running.backends.evaluation import eager_forward

        # a compiled model is evaluated through its eager forward, as on one GPU (inside this module's call: FSDP's
        # root hooks gather what the forward needs)
        return eager_forward(self.model)(**model_kwargs)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (the classes transformers names in `_no_split_modules`), which FSDP shards
    one by one."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard")
    return layers


def share_model(module: TrainingModule, args: TrainingArgs, device: torch.device) -> torch.nn.Module:
    """`module` shared over the ranks as `args.parallelism` says: wrapped in DistributedDataParallel, or sharded in
    place with FSDP2 (`fully_shard` on each decoder layer, then on the whole), parameters kept in the model's dtype
    as on one GPU. Build the optimizer after this: FSDP replaces the parameters by their shards."""
    if args.parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # no buffer changes during training (rotary tables are constant): nothing to broadcast every forward
        return DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,
            bucket_cap_mb=args.ddp_bucket_cap_mb,
            gradient_as_bucket_view=args.ddp_gradient_as_bucket_view,
        )
    if args.parallelism == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(module.model):
            fully_shard(layer)
        fully_shard(module)
        return module
    raise ValueError(f"a run on {args.world_size} GPUs needs parallelism 'ddp' or 'fsdp', not {args.parallelism!r}")


def unshared(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (which evaluates without syncing anything); an FSDP module as it is (its
    forward gathers the shards)."""
    return getattr(module, "module", module) if type(module).__name__ == "DistributedDataParallel" else module


@contextlib.contextmanager
def gradient_sync(module: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Reduce gradients over the ranks in this block's backward only when `sync` (the last micro-batch of an
    accumulated step): the other micro-batches accumulate locally, as DDP's `no_sync` and FSDP's
    `set_requires_gradient_sync` intend."""
    if sync:
        yield
    elif hasattr(module, "no_sync"):
        with module.no_sync():
            yield
    elif hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


def rank_sampler(dataset_size: int, seed: int) -> "torch.utils.data.DistributedSampler":
    """This rank's share of the shuffled examples (a different one on each rank, the same order for a seed)."""
    from torch.utils.data import DistributedSampler

    return DistributedSampler(
        range(dataset_size),
        num_replicas=dist.get_world_size(),
        rank=dist.get_rank(),
        shuffle=True,
        seed=seed,
        drop_last=True,
    )
