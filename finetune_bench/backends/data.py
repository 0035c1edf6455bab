"""Tokenized prompt/completion examples and their batches, for the backends that build their own
(the plain loop and the HF Trainer): prompt + completion + EOS, truncated to max_seq_length, loss on
completion tokens only, right-padded per batch to the longest example."""

import torch

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
