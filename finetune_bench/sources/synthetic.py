"""Generated text, for offline datasets and offline tokenizers: alpaca-format records whose response
lengths follow a chosen distribution, and a byte-level BPE tokenizer trained on such text."""

import random
from typing import TYPE_CHECKING

from finetune_bench.inputs.catalog import SYNTHETIC_LENGTH_DISTRIBUTIONS

if TYPE_CHECKING:
    import transformers

_SYLLABLES = [c + v for c in "bdklmnrstv" for v in "aeiou"]
_TASKS = [
    "Summarize the following text.",
    "Translate the passage into plain language.",
    "Write a short story about the topic.",
    "Explain the idea step by step.",
    "List the main points of the note.",
    "Answer the question with reasons.",
    "Rewrite the paragraph more formally.",
    "Give three examples related to the subject.",
]


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)]


def _sentence(rng: random.Random, words: list[str], n_words: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n_words)).capitalize() + "."


# The lognormal response length: its median sits this far up the [min, max] range, and its spread
# (sigma of the log) puts about one response in twenty beyond max (cut to max): chat-like lengths,
# mostly short with a long tail.
LOGNORMAL_MEDIAN_FRACTION = 0.25
LOGNORMAL_SIGMA = 0.85


def response_length(rng: random.Random, distribution: str, min_words: int, max_words: int) -> int:
    """One response length in words, drawn from `distribution` (see `SYNTHETIC_LENGTH_DISTRIBUTIONS`)
    and kept inside [min_words, max_words]."""
    if distribution == "uniform":
        return rng.randint(min_words, max_words)
    if distribution == "fixed":
        return max_words
    span = max_words - min_words
    if distribution == "normal":
        # mean at the midpoint; the range is ±3 standard deviations, so about 0.3% are clipped
        drawn = rng.gauss(min_words + span / 2, span / 6)
    elif distribution == "lognormal":
        drawn = min_words + span * LOGNORMAL_MEDIAN_FRACTION * rng.lognormvariate(0.0, LOGNORMAL_SIGMA)
    else:
        raise ValueError(f"unknown length distribution {distribution!r}; known: {list(SYNTHETIC_LENGTH_DISTRIBUTIONS)}")
    return min(max_words, max(min_words, round(drawn)))


def generate_alpaca_records(
    num_examples: int, min_words: int, max_words: int, seed: int = 0, length_distribution: str = "uniform"
) -> list[dict]:
    """Alpaca-format records (instruction, input, output) with response lengths in words drawn from
    `length_distribution` within [min_words, max_words]."""
    rng = random.Random(seed)
    words = _vocabulary(rng)
    records = []
    for _ in range(num_examples):
        instruction = rng.choice(_TASKS)
        context = _sentence(rng, words, rng.randint(0, 24)) if rng.random() < 0.6 else ""
        n_words = response_length(rng, length_distribution, min_words, max_words)
        records.append({"instruction": instruction, "input": context, "output": _sentence(rng, words, n_words)})
    return records


def train_offline_tokenizer(vocab_size: int, seed: int = 0) -> "transformers.PreTrainedTokenizerFast":
    """A byte-level BPE tokenizer trained on generated text: no network, about a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|begin|>", "<|end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        r["instruction"] + " " + r["input"] + " " + r["output"] for r in generate_alpaca_records(2000, 8, 64, seed)
    ]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<|pad|>", bos_token="<|begin|>", eos_token="<|end|>"
    )
