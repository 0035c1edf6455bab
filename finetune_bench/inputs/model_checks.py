"""What planning knows about a model that a run would only find out by crashing: an override value transformers
does not take (an activation it does not know, a probability outside [0, 1]), a vocabulary smaller than the
tokenizer's, a position table shorter than the sequences, LoRA targets that name no module, a scheduler transformers
does not know.

Transformers' own names (its activations, its schedulers) are read from its source, as `inputs.arms` reads Liger's
table: importing them loads torch, seconds on a machine that only plans.
"""

import ast
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from finetune_bench.inputs.catalog import RANDOM_PREFIX, offline_tokenizer_tokens
from finetune_bench.inputs.errors import SpecError, closest

OVERRIDES_KEY = "training_args.model_config_overrides"

# Config keys that name an activation (transformers looks each up in `transformers.activations.ACT2FN`).
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "activation", "act_fn")
# Config keys that are probabilities (dropout rates, GPT-2's `*_pdrop`), and the suffixes that mark one.
_PROBABILITY_SUFFIXES = ("dropout", "_pdrop", "_prob", "_probability", "dropout_rate")
# Model types whose positions are a learned table of absolute positions (the key holding its length): a sequence
# longer than the table indexes past it.
ABSOLUTE_POSITION_KEYS = {
    "gpt2": "n_positions",
    "gpt_bigcode": "n_positions",
    "gpt_neo": "max_position_embeddings",
    "opt": "max_position_embeddings",
    "biogpt": "max_position_embeddings",
    "xglm": "max_position_embeddings",
}


def _transformers_source(module: str) -> ast.Module:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("transformers is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / f"{module}.py"
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def activation_names() -> tuple[str, ...]:
    """The names `transformers.activations.ACT2FN` takes (the keys of its `ACT2CLS`)."""
    for node in _transformers_source("activations").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ACT2CLS" for t in node.targets):
            if isinstance(node.value, ast.Dict):
                return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    from transformers.activations import ACT2FN  # the source changed its shape: ask the module itself

    return tuple(ACT2FN)


@functools.cache
def scheduler_types() -> tuple[str, ...]:
    """The values of transformers' `SchedulerType` enum (`lr_scheduler_type`)."""
    for node in _transformers_source("trainer_utils").body:
        if isinstance(node, ast.ClassDef) and node.name == "SchedulerType":
            return tuple(
                item.value.value
                for item in node.body
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
            )
    from transformers.trainer_utils import SchedulerType

    return tuple(s.value for s in SchedulerType)


def check_scheduler(key: str, value: Any) -> None:
    """A scheduler name transformers' `SchedulerType` has (the setting's rule)."""
    known = scheduler_types()
    if isinstance(value, str) and value not in known:
        raise SpecError(
            f"{key}: {value!r} is not a scheduler transformers knows{closest(value, list(known))}; its schedulers "
            f"(transformers.SchedulerType): {list(known)}"
        )


def is_probability_key(name: str) -> bool:
    return name.endswith(_PROBABILITY_SUFFIXES)


def override_value_problems(overrides: dict[str, Any], where: str = "") -> list[str]:
    """Values no config of any model takes (known without its config): an activation transformers does not know, a
    probability (a dropout rate) outside [0, 1]."""
    problems = []
    for name, value in overrides.items():
        if name in ACTIVATION_KEYS and isinstance(value, str) and value not in activation_names():
            problems.append(
                f"{OVERRIDES_KEY}: {name}={value} is not an activation transformers knows{where}"
                f"{closest(value, list(activation_names()))}; its activations (transformers.activations.ACT2FN): "
                f"{', '.join(activation_names())}"
            )
        elif is_probability_key(name) and isinstance(value, int | float) and not isinstance(value, bool):
            if not 0 <= value <= 1:
                problems.append(
                    f"{OVERRIDES_KEY}: {name}={value} is a probability{where}: it must be in [0, 1] (e.g. {name}=0.1)"
                )
    return problems


def vocabulary_problem(model_name: str, config: dict, overrides: dict[str, Any], where: str = "") -> str:
    """An overridden `vocab_size` smaller than the tokenizer's vocabulary, where the tokenizer is known at planning
    (a `random:` model's offline one): token ids past the embedding table would index out of it."""
    vocab = overrides.get("vocab_size")
    if not model_name.startswith(RANDOM_PREFIX) or not isinstance(vocab, int) or isinstance(vocab, bool):
        return ""
    bundled = config.get("vocab_size")
    if not isinstance(bundled, int):
        return ""
    tokens = offline_tokenizer_tokens(bundled)
    if vocab >= tokens:
        return ""
    return (
        f"{OVERRIDES_KEY}: vocab_size={vocab} is smaller than the {tokens:,} tokens of {model_name!r}'s tokenizer"
        f"{where}: its token ids past {vocab - 1} would index out of the embedding table; use vocab_size={tokens} or "
        "more"
    )


def position_table_problem(model_name: str, merged: dict, max_seq_length: int, where: str = "") -> str:
    """A learned table of absolute positions (GPT-2's `n_positions`, ...) shorter than `max_seq_length`."""
    key = ABSOLUTE_POSITION_KEYS.get(merged.get("model_type", ""))
    length = merged.get(key) if key else None
    if not isinstance(length, int) or max_seq_length <= length:
        return ""
    return (
        f"training_args.max_seq_length {max_seq_length} is longer than the {length} absolute positions of "
        f"{model_name!r} ({key}){where}: a model of type {merged['model_type']!r} learns one embedding per position, "
        f"and a longer sequence indexes past its table; use max_seq_length {length} or less (or override "
        f"{key}={max_seq_length} on a random: model)"
    )


def lora_target_problem(model_name: str, merged: dict, targets: str, where: str = "") -> str:
    """LoRA target module names (not `all-linear`) that match no module of the model, as peft matches them (the
    whole name, or its last dotted parts). The model is built on the meta device from its config, no weights: only
    where the config is known without a download (a `random:` model, a local directory)."""
    wanted = [name.strip() for name in targets.split(",") if name.strip()]
    if not wanted or targets.strip() == "all-linear":
        return ""
    modules = _module_names(json.dumps(merged, sort_keys=True))
    missing = [t for t in wanted if not any(m == t or m.endswith(f".{t}") for m in modules)]
    if not missing:
        return ""
    linear = sorted({name.rsplit(".", 1)[-1] for name, is_linear in modules.items() if is_linear})
    hint = closest(missing[0], linear)
    return (
        f"training_args.lora_target_modules {targets!r}: {', '.join(map(repr, missing))} "
        f"{'matches' if len(missing) == 1 else 'match'} no module of "
        f"{model_name!r}{where}{hint}; its linear layers: {', '.join(linear)} (or 'all-linear')"
    )


@functools.cache
def _module_names(config_json: str) -> dict[str, bool]:
    """Every module name of the model `config_json` makes (built on the meta device: no memory, no weights), and
    whether it is a linear layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    merged = json.loads(config_json)
    params = {name: value for name, value in merged.items() if name not in ("model_type", "_name_or_path")}
    config = AutoConfig.for_model(merged["model_type"], **params)  # as transformers builds it: its validation runs
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # GPT-2's projections are transformers' Conv1D, a linear layer with its weight transposed (peft targets it).
    return {name: type(module).__name__ in ("Linear", "Conv1D") for name, module in model.named_modules() if name}
