"""Dataset formats: how the rows of each supported dataset become a prompt and a completion.

The hub datasets known by name (their format, configs and trainable splits) are listed in
`finetune_bench.inputs.catalog.HUB_DATASETS`; anything else (a local file, another hub id) is
recognised by its columns (`detect_format`).

Every format converts a whole `datasets.Dataset` to TRL's prompt/completion columns (or keeps a
plain `text` column): most map row by row, but OpenAssistant's messages form trees, and a reply
is found through its parent.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from finetune_bench.inputs.catalog import known_dataset

if TYPE_CHECKING:
    import datasets

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"
QUESTION_PROMPT = "### Question:\n{question}\n\n{choices_block}### Answer:\n"
# One turn of an OpenAssistant thread, as the prompt shows the conversation so far.
OASST_TURN = {"prompter": "### User:\n{text}\n\n", "assistant": "### Assistant:\n{text}\n\n"}
OASST_REPLY_CUE = "### Assistant:\n"


@dataclass(frozen=True)
class DatasetFormat:
    name: str
    # The columns that identify the format (`detect_format` looks for them, in registry order).
    columns: frozenset[str]
    # The whole dataset to prompt/completion (or text) columns, nothing else.
    convert: Callable
    description: str


def _row_by_row(format_row: Callable[[dict], dict | None]) -> Callable:
    """A converter applying `format_row` to every row; a row it maps to None is dropped."""

    def convert(dataset: "datasets.Dataset") -> "datasets.Dataset":
        def convert_batch(batch: dict[str, list]) -> dict[str, list]:
            out: dict[str, list] = {"prompt": [], "completion": []}
            for values in zip(*batch.values(), strict=True):
                pair = format_row(dict(zip(batch, values, strict=True)))
                if pair is not None:
                    out["prompt"].append(pair["prompt"])
                    out["completion"].append(pair["completion"])
            return out

        return dataset.map(convert_batch, batched=True, remove_columns=dataset.column_names)

    return convert


def _keep(*columns: str) -> Callable:
    return lambda dataset: dataset.select_columns(list(columns))


# ---------------------------------------------------------------------------------------------
# One formatter per dataset schema


def format_alpaca(row: dict) -> dict:
    """tatsu-lab/alpaca: instruction, optional input, output (its `text` column is ignored)."""
    input_block = f"### Input:\n{row['input']}\n\n" if row.get("input") else ""
    prompt = ALPACA_PROMPT.format(instruction=row["instruction"], input_block=input_block)
    return {"prompt": prompt, "completion": row["output"]}


def format_commonsense_qa(row: dict) -> dict | None:
    """tau/commonsense_qa: the question and its lettered choices; the completion is the answer's
    letter and text ("B. bank"). Rows without an answer key (its test split hides them) are dropped."""
    labels, texts = row["choices"]["label"], row["choices"]["text"]
    answer = row.get("answerKey") or ""
    if answer not in labels:
        return None
    choices_block = "### Choices:\n" + "".join(f"{label}. {text}\n" for label, text in zip(labels, texts, strict=True))
    prompt = QUESTION_PROMPT.format(question=row["question"], choices_block=choices_block + "\n")
    return {"prompt": prompt, "completion": f"{answer}. {texts[labels.index(answer)]}"}


def format_gsm8k(row: dict) -> dict:
    """openai/gsm8k and madrylab/gsm8k-platinum: the completion is the whole worked answer, calculator
    annotations and the final `#### <number>` line included (what a model fine-tuned on it learns to write)."""
    return {"prompt": QUESTION_PROMPT.format(question=row["question"], choices_block=""), "completion": row["answer"]}


def oasst_pairs(rows: Iterable[dict], languages: Iterable[str] | None = None) -> list[dict]:
    """OpenAssistant/oasst1 messages to prompt/completion pairs: one per prompter message that has a
    reply, with its best reply (lowest `rank`, rank 0 being the most preferred; an unranked reply
    counts after the ranked ones, ties go to the first in the data). The prompt is the thread from the
    initial prompt down to that message, so a follow-up question keeps its context.

    Deleted messages are skipped. `languages` (e.g. ["en"]) keeps the pairs whose reply is in one of them.
    """
    wanted = set(languages) if languages else None
    messages = {row["message_id"]: row for row in rows if not row.get("deleted")}
    best_reply: dict[str, dict] = {}
    for order, message in enumerate(messages.values()):
        parent = messages.get(message.get("parent_id") or "")
        if message["role"] != "assistant" or parent is None or parent["role"] != "prompter":
            continue
        if wanted is not None and message.get("lang") not in wanted:
            continue
        rank = message.get("rank")
        key = (rank is None, rank if rank is not None else 0, order)
        current = best_reply.get(parent["message_id"])
        if current is None or key < current["key"]:
            best_reply[parent["message_id"]] = {"key": key, "message": message}

    pairs = []
    for prompter_id, reply in best_reply.items():
        thread, node = [], messages.get(prompter_id)
        while node is not None:
            thread.append(node)
            node = messages.get(node.get("parent_id") or "")
        if thread[-1].get("parent_id"):
            continue  # an ancestor was deleted: the conversation has a hole
        turns = "".join(OASST_TURN[m["role"]].format(text=m["text"]) for m in reversed(thread))
        pairs.append({"prompt": turns + OASST_REPLY_CUE, "completion": reply["message"]["text"]})
    return pairs


def _convert_oasst(dataset: "datasets.Dataset", languages: Iterable[str] | None = None) -> "datasets.Dataset":
    import datasets

    # Only the columns the pairing reads: the others (toxicity scores, emojis, labels) are slow to decode.
    used = sorted(OASST.columns | ({"deleted", "lang", "rank"} & set(dataset.column_names)))
    pairs = oasst_pairs(dataset.select_columns(used), languages)
    features = datasets.Features({"prompt": datasets.Value("string"), "completion": datasets.Value("string")})
    return datasets.Dataset.from_list(pairs, features=features)


# ---------------------------------------------------------------------------------------------
# The formats, in the order `detect_format` tries them (most specific first: oasst and alpaca rows
# also have a `text` column, commonsense_qa rows a `question`).

PROMPT_COMPLETION = DatasetFormat(
    "prompt_completion", frozenset({"prompt", "completion"}), _keep("prompt", "completion"), "prompt, completion"
)
OASST = DatasetFormat(
    "oasst",
    frozenset({"message_id", "parent_id", "text", "role"}),
    _convert_oasst,
    "OpenAssistant messages (message_id, parent_id, text, role, rank)",
)
ALPACA = DatasetFormat(
    "alpaca", frozenset({"instruction", "output"}), _row_by_row(format_alpaca), "instruction, input, output"
)
COMMONSENSE_QA = DatasetFormat(
    "commonsense_qa",
    frozenset({"question", "choices", "answerKey"}),
    _row_by_row(format_commonsense_qa),
    "question, choices {label, text}, answerKey",
)
GSM8K = DatasetFormat("gsm8k", frozenset({"question", "answer"}), _row_by_row(format_gsm8k), "question, answer")
TEXT = DatasetFormat("text", frozenset({"text"}), _keep("text"), "text (language modelling on the whole text)")

FORMATS = {f.name: f for f in (PROMPT_COMPLETION, OASST, ALPACA, COMMONSENSE_QA, GSM8K, TEXT)}


def known_formats() -> str:
    return "; ".join(f"{f.name} ({f.description})" for f in FORMATS.values())


def detect_format(columns: Iterable[str], dataset_name: str = "") -> DatasetFormat:
    """The format of a dataset: by its hub id when the registry knows it, else by its columns."""
    columns = set(columns)
    known = known_dataset(dataset_name) if dataset_name else None
    if known is not None:
        fmt = FORMATS[known.format]
        missing = fmt.columns - columns
        if missing:
            raise ValueError(
                f"dataset {dataset_name!r} should have the {fmt.name} columns but lacks {sorted(missing)} "
                f"(it has {sorted(columns)})"
            )
        return fmt
    for fmt in FORMATS.values():
        if fmt.columns <= columns:
            return fmt
    raise ValueError(
        f"a dataset with columns {sorted(columns)} is in no known format; known formats: {known_formats()}"
    )


def to_prompt_completion(dataset: "datasets.Dataset", fmt: DatasetFormat) -> "datasets.Dataset":
    """`dataset` converted by `fmt`; an error if no row is left (nothing to train on)."""
    converted = fmt.convert(dataset)
    if len(converted) == 0:
        raise ValueError(
            f"the {fmt.name} dataset has no usable row out of {len(dataset)} (e.g. a split without answers)"
        )
    return converted
