"""Tokenized prompt/completion examples and their batches, for the backends that build their own
(the plain loop and the HF Trainer): prompt + completion + EOS, truncated to max_seq_length, loss on
completion tokens only, right-padded per batch to the longest example (or up to a multiple of
`pad_to_multiple_of`)."""

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import datasets
    import transformers

IGNORE_INDEX = -100


def tokenize_prompt_completion(
    dataset: "datasets.Dataset", tokenizer: "transformers.PreTrainedTokenizerBase", max_length: int
) -> "datasets.Dataset":
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


def training_row_lengths(data: "datasets.Dataset") -> list[int]:
    """Every training row's length in tokens, in order (read from Arrow a chunk at a time: no row is built in
    Python)."""
    import pyarrow.compute as pc

    lengths: list[int] = []
    for chunk in data.select_columns(["input_ids"]).with_format("arrow").iter(batch_size=65536):
        lengths.extend(pc.list_value_length(chunk["input_ids"]).to_pylist())
    return lengths


def collate(rows: list[dict], pad_token_id: int, pad_to_multiple_of: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row of the batch, rounded up to a multiple of `pad_to_multiple_of` (0: not
    rounded)."""
    longest = max(len(row["input_ids"]) for row in rows)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = torch.tensor(row["labels"])
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# ---------------------------------------------------------------------------------------------
# Packing: several examples per row, no padding.
#
# A packed row carries `position_ids` that restart at 0 at every example and no attention mask:
# transformers (5.x, models whose masks come from `masking_utils`) then builds a block-diagonal causal
# mask for eager/sdpa/flex attention, or variable-length sequences for flash attention, so an example
# never attends to the one before it in the row. That detection only happens when the forward gets no
# attention mask and builds no KV cache (use_cache=False); `check_packing_isolates_examples` verifies it
# on the model that trains. TRL's padding-free collator relies on the same mechanism.


def pack(encoded: "datasets.Dataset", max_length: int) -> "datasets.Dataset":
    """Concatenate tokenized examples (input_ids, labels), in order, and cut them into rows of exactly
    `max_length` tokens with `position_ids`; only the last, partial row is dropped.

    An example that does not fit in the rest of a row continues at the start of the next one, as a new
    segment (its positions restart at 0, it cannot see its beginning). Each example's first label is
    masked: in a packed row the previous example's last token would otherwise be trained to predict it
    (unpacked, a first token is never a target either). Prompt masking is kept as it is.
    """
    import datasets
    import numpy as np

    lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
    n_rows = int(lengths.sum()) // max_length
    if n_rows == 0:
        raise ValueError(f"the dataset has {int(lengths.sum())} tokens, fewer than one packed row of {max_length}")
    input_ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded["input_ids"]])
    labels = np.concatenate([np.asarray(lbl, dtype=np.int64) for lbl in encoded["labels"]])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    labels[starts] = IGNORE_INDEX
    example = np.repeat(np.arange(len(lengths)), lengths)
    positions = np.arange(len(input_ids)) - np.repeat(starts, lengths)

    keep = n_rows * max_length
    shape = (n_rows, max_length)
    input_ids, labels = input_ids[:keep].reshape(shape), labels[:keep].reshape(shape)
    example, positions = example[:keep].reshape(shape), positions[:keep].reshape(shape)
    # An example carried over from the previous row restarts at position 0.
    carried = example == example[:, :1]
    positions = np.where(carried, positions - positions[:, :1], positions)
    return datasets.Dataset.from_dict(
        {"input_ids": input_ids.tolist(), "labels": labels.tolist(), "position_ids": positions.tolist()}
    )


def collate_packed(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Stack packed rows (all `max_length` long): input_ids, labels, position_ids and, deliberately, no
    attention mask (with one, transformers would let examples of a row attend to each other)."""
    return {
        key: torch.tensor([row[key] for row in rows], dtype=torch.long)
        for key in ("input_ids", "labels", "position_ids")
    }


class PackingNotIsolated(RuntimeError):
    """The model lets packed examples attend to each other: packing would train on cross-example context."""


def check_packing_isolates_examples(model: torch.nn.Module) -> None:
    """Raise PackingNotIsolated unless a packed example's logits are unaffected by the example before it.

    Two rows share their second example and differ in the first; with position_ids restarting at the
    boundary and no attention mask, the second example's logits must agree. A model whose attention
    ignores position_ids for masking (custom code, an attention implementation transformers does not
    build masks for) fails here instead of silently training on contaminated context.
    """
    vocab = model.get_input_embeddings().num_embeddings
    device = model.get_input_embeddings().weight.device
    first, other_first, second = (torch.arange(start, start + n) % vocab for start, n in ((5, 6), (40, 6), (80, 7)))
    input_ids = torch.stack([torch.cat([first, second]), torch.cat([other_first, second])]).to(device)
    position_ids = torch.cat([torch.arange(len(first)), torch.arange(len(second))]).expand(2, -1).to(device)
    # A model compiled in place (`model.compile()`) is probed through its eager forward: compiling for
    # this probe's shapes would only add a compilation before training.
    forward = model.forward if getattr(model, "_compiled_call_impl", None) is not None else model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = forward(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.float()
    finally:
        model.train(was_training)
    tail = logits[:, len(first) :]
    difference = (tail[0] - tail[1]).abs().max().item()
    scale = tail.abs().max().item()
    if difference > 1e-2 * max(scale, 1.0):
        attention = getattr(model.config, "_attn_implementation", "?")
        raise PackingNotIsolated(
            f"packed examples attend to each other in this model (type {model.config.model_type!r}, attention "
            f"{attention!r}): a packed example's logits moved by {difference:.3g} when the example before it "
            "changed. Run it with packing false."
        )


class NotOneBatch(ValueError):
    """The dataset cannot fill one batch: training on fewer sequences than the batch is labelled with
    would be a lie."""


def require_one_batch(usable_examples: int, batch_size: int, max_seq_length: int) -> None:
    """Fail unless `usable_examples` fill at least one batch of `batch_size` (a run never trains a batch
    smaller than it says): `TrainingArgs.examples_per_step`, the batch of every rank, wherever this is checked.
    No usable example at all usually means every prompt fills `max_seq_length`."""
    if usable_examples >= batch_size:
        return
    if usable_examples == 0:  # whatever the batch: one reason for every run it stops
        raise NotOneBatch(
            f"the dataset has 0 usable examples: every example's prompt fills max_seq_length {max_seq_length}, "
            "leaving nothing to learn from"
        )
    raise NotOneBatch(f"the dataset has {usable_examples} usable examples, fewer than one batch of {batch_size}")


def _prompt_lengths(dataset: "datasets.Dataset", tokenizer: "transformers.PreTrainedTokenizerBase") -> list[int]:
    """The token count of each example's prompt (the dataset has a `prompt` column of text)."""
    return [len(ids) for ids in tokenizer(list(dataset["prompt"]))["input_ids"]]


def _text_prompts(dataset: "datasets.Dataset") -> bool:
    """Whether the dataset's prompts are text (a prompt/completion dataset of conversations holds lists of messages,
    which TRL renders with the chat template itself: not counted here)."""
    return "prompt" in dataset.column_names and all(isinstance(p, str) for p in dataset["prompt"])


def usable_examples(
    dataset: "datasets.Dataset", tokenizer: "transformers.PreTrainedTokenizerBase", lengths: list[int]
) -> dict[int, int]:
    """How many examples `tokenize_prompt_completion` keeps at each max_seq_length of `lengths`: those whose
    prompt leaves room for at least one completion token (a plain-text row always does). The prompts are
    tokenized once, whatever the number of lengths."""
    if not _text_prompts(dataset):
        return dict.fromkeys(lengths, len(dataset))
    prompt_lengths = _prompt_lengths(dataset, tokenizer)
    return {length: sum(n < length for n in prompt_lengths) for length in lengths}


def packed_rows(
    dataset: "datasets.Dataset", tokenizer: "transformers.PreTrainedTokenizerBase", lengths: list[int]
) -> dict[int, int]:
    """How many rows `pack` makes of the examples `tokenize_prompt_completion` keeps, at each max_seq_length of
    `lengths`: their tokens (each example truncated to the length) over the length, the partial last row dropped."""
    rows = {}
    for length in lengths:
        tokens = sum(training_row_lengths(tokenize_prompt_completion(dataset, tokenizer, length)))
        rows[length] = tokens // length
    return rows


def with_room_for_a_completion(
    dataset: "datasets.Dataset", tokenizer: "transformers.PreTrainedTokenizerBase", max_seq_length: int
) -> "datasets.Dataset":
    """The examples `tokenize_prompt_completion` keeps, untokenized (for TRL, which tokenizes itself): those whose
    prompt leaves room for at least one completion token at `max_seq_length`. Truncated, the others have nothing to
    learn from, and packed rows made of them alone would have no labelled token (a loss of 0/0). A dataset of plain
    text, or of conversations, as it is."""
    if not _text_prompts(dataset):
        return dataset
    return dataset.select([i for i, n in enumerate(_prompt_lengths(dataset, tokenizer)) if n < max_seq_length])
