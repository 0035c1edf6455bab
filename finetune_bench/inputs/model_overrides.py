"""`model_config_overrides`: Hugging Face config keys set to other values before the model is built.

The setting is a string, `"num_hidden_layers=8,intermediate_size=14336"`: comma-separated `key=value` pairs, each
value an integer (`8`), a float (`1.0e-5`, `500000.0`), a boolean (`true` / `false`) or a plain string
(`gelu_pytorch_tanh`). A string travels through Flyte's literals, a YAML inputs file and a sweep's list like any
other setting, and reads as itself in a condition id and in the results table.

The overrides are applied to the model's config after the model is prepared (`apply_config_overrides`): the
bundled config of a `random:<architecture>` model, a local directory's config.json, or a hub model's downloaded
one. So the download cache never changes with them, while the memory model, the FLOPs count, the results store's
key and the results table all see them.

Checked in two places, with the same function (`check_overrides_against_config`): at planning, against the config
known then (a bundled architecture, a local directory); for a hub id, whose config comes with the download, before
any run is launched (`finetune_bench.running.preflight`). Only the syntax, and the keys that reshape a pretrained
checkpoint's weights, are checked for a hub id at planning.
"""

import json
import math
import re
from pathlib import Path
from typing import Any

from finetune_bench.inputs.catalog import RANDOM_PREFIX, architecture_config, looks_like_path
from finetune_bench.inputs.errors import SpecError, closest, refuse_spellings_of_one_value
from finetune_bench.inputs.model_checks import override_value_problems, vocabulary_problem

OVERRIDES_KEY = "training_args.model_config_overrides"

Override = int | float | bool | str

# Keys no override may set, and why.
FIXED_KEYS = {
    "model_type": "it names the model class; choose another model_name instead",
    "architectures": "it names the model class; choose another model_name instead",
    "_name_or_path": "it names where the config came from",
    "transformers_version": "transformers writes it",
    "torch_dtype": "the dtype is training_args.dtype",
    "dtype": "the dtype is training_args.dtype",
    "bos_token_id": "the tokenizer's special tokens decide it",
    "eos_token_id": "the tokenizer's special tokens decide it",
    "pad_token_id": "the tokenizer's special tokens decide it",
}
# Keys that change the shape (or the presence) of a pretrained checkpoint's weights: its weights could then not be
# loaded into the model. A shape study takes a `random:<architecture>` model, which is built at random anyway.
WEIGHT_SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "n_embd",
    "n_head",
    "n_inner",
)
# Keys that count something (layers, heads, widths): an override of one must be a positive integer.
COUNT_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "n_embd",
    "n_head",
    "n_layer",
    "n_positions",
)
LAYER_COUNT_KEY = "num_hidden_layers"
# Where transformers 5 keeps the RoPE settings once it has read a config (`rope_theta` among them).
ROPE_PARAMETERS_KEY = "rope_parameters"

_INTEGER = re.compile(r"[+-]?\d+")
_BOOLEANS = {"true": True, "false": False}


def parse_config_overrides(text: str, key: str = OVERRIDES_KEY) -> dict[str, Override]:
    """The overrides `text` spells (`"num_hidden_layers=8,rope_theta=1.0e6"`), typed; empty text: none. A
    SpecError naming `key` for a pair without `=`, an empty name or value, a key given twice, a number that is
    not finite."""
    if not isinstance(text, str):
        raise SpecError(f"{key} must be str, got {text!r}")
    overrides: dict[str, Override] = {}
    problems = []
    for pair in (part.strip() for part in text.split(",")) if text.strip() else ():
        name, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not name or not value:
            problems.append(
                f"{key}: {pair!r} is not a key=value pair (write e.g. 'num_hidden_layers=8,intermediate_size=14336')"
            )
        elif name in overrides:
            problems.append(f"{key}: {name!r} is given twice")
        else:
            parsed = _typed(value)
            if isinstance(parsed, float) and not math.isfinite(parsed):
                problems.append(f"{key}: {name}={value} is not a finite number")
            overrides[name] = parsed
    if problems:
        raise SpecError(*problems)
    return overrides


def _typed(value: str) -> Override:
    """An integer, a float, a boolean (`true` / `false`), or else the string itself."""
    if _INTEGER.fullmatch(value):
        return int(value)
    if value.lower() in _BOOLEANS:
        return _BOOLEANS[value.lower()]
    try:
        return float(value)
    except ValueError:
        return value


def canonical_overrides(text: str) -> tuple:
    """What `text` sets, whatever its spelling: the pairs in key order, each value typed (`5.0e5` is `500000.0`,
    spaces and order do not count; true stays apart from 1)."""
    overrides = parse_config_overrides(text)
    return tuple(sorted((name, (type(value) is bool, value)) for name, value in overrides.items()))


def check_overrides_sweep(key: str, values: list) -> None:
    """A sweep of overrides whose every value sets something else: two spellings of the same overrides would train
    the same model twice under two names."""
    refuse_spellings_of_one_value(
        key,
        values,
        canonical_overrides,
        "set the same overrides (spaces, order and the spelling of a number do not count): the same model would be "
        "trained twice",
    )


def check_config_overrides_syntax(key: str, value: Any) -> None:
    """The setting's own rule: overrides that parse (what they may change is checked against the model's config)."""
    parse_config_overrides(value, key)


def config_known_at_planning(model_name: str) -> dict | None:
    """The config a model's overrides are checked against before any download: a bundled architecture's, a local
    directory's config.json; None for a hub id (its config comes with the download) or a directory without one
    (refused by the model-name check)."""
    if model_name.startswith(RANDOM_PREFIX):
        return architecture_config(model_name.removeprefix(RANDOM_PREFIX))
    if looks_like_path(model_name):
        path = Path(model_name).expanduser() / "config.json"
        return json.loads(path.read_text()) if path.is_file() else None
    return None


def check_model_config_overrides(model_name: str, text: str, where: str = "") -> None:
    """The overrides `text` of model `model_name`, as far as planning can check them: their syntax, the keys a
    pretrained checkpoint cannot take, and, where the config is known before the download, everything
    `check_overrides_against_config` checks. `where` names the condition of a sweep."""
    overrides = parse_config_overrides(text)
    if not overrides:
        return
    config = config_known_at_planning(model_name)
    if config is None:
        problems = override_value_problems(overrides, where) + _pretrained_problems(model_name, overrides, {}, where)
        if problems:
            raise SpecError(*problems)
        return
    check_overrides_against_config(model_name, config, overrides, where)


def config_at_planning(model_name: str, text: str) -> dict | None:
    """The config a condition's model is built from, overrides applied, where it is known before any download (a
    `random:` model, a local directory); None for a hub id, or overrides that do not parse (refused on their own)."""
    try:
        config = config_known_at_planning(model_name)
        overrides = parse_config_overrides(text)
    except (SpecError, ValueError, OSError):
        return None
    return None if config is None else apply_config_overrides(config, overrides)


def is_pretrained(model_name: str) -> bool:
    """Whether `model_name` loads a checkpoint's weights (anything but a `random:<architecture>` model)."""
    return not model_name.startswith(RANDOM_PREFIX)


def known_config_keys(config: dict) -> list[str]:
    """The keys an override may set in `config`: the scalar keys of the config itself, of its RoPE parameters, and
    of its model type's config class (transformers' own defaults, without the keys every config has), less
    `FIXED_KEYS`."""
    keys = {name for name, value in config.items() if _is_scalar(value)}
    keys |= set(config.get(ROPE_PARAMETERS_KEY) or {})
    keys |= _architecture_keys(config.get("model_type", ""))
    return sorted(keys - set(FIXED_KEYS))


def _architecture_keys(model_type: str) -> set[str]:
    """The scalar keys transformers' config class of `model_type` declares beyond `PretrainedConfig`'s own."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return set()
    own = CONFIG_MAPPING[model_type]().to_dict()
    generic = set(PretrainedConfig().to_dict())
    return {name for name, value in own.items() if name not in generic and _is_scalar(value)}


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, int | float | str | bool)


def check_overrides_against_config(
    model_name: str, config: dict, overrides: dict[str, Override], where: str = ""
) -> None:
    """Every problem of `overrides` for the model `model_name` whose config is `config`, in one SpecError: a key
    that is not one of the config's (naming the known ones), a key no override may set, a value of another type
    than the config's, a count that is not positive, a key that would reshape a pretrained checkpoint's weights;
    then, when those hold, a model the overridden config cannot make (transformers' own message where it has
    one)."""
    known = known_config_keys(config)
    problems = []
    for name, value in overrides.items():
        if name in FIXED_KEYS:
            problems.append(f"{OVERRIDES_KEY}: {name!r} cannot be overridden{where}: {FIXED_KEYS[name]}")
        elif name not in known:
            problems.append(
                f"{OVERRIDES_KEY}: {name!r} is not a config key of {model_name!r}{where}"
                f"{closest(name, known)}; its keys: {', '.join(known)}"
            )
        else:
            problem = _type_problem(name, value, _current_value(config, name))
            if problem:
                problems.append(f"{OVERRIDES_KEY}: {problem}{where}")
    problems += override_value_problems(overrides, where)
    problems += _pretrained_problems(model_name, overrides, config, where)
    problems += [p for p in [vocabulary_problem(model_name, config, overrides, where)] if p]
    if problems:
        raise SpecError(*problems)
    _check_overridden_model(model_name, apply_config_overrides(config, overrides), where)


def _current_value(config: dict, name: str) -> Any:
    if name in config:
        return config[name]
    return (config.get(ROPE_PARAMETERS_KEY) or {}).get(name)


def _type_problem(name: str, value: Override, current: Any) -> str:
    """Why `value` cannot replace `current` (a bool for a bool, an integer for an integer, a number for a float, a
    string for a string; a positive integer for a count), or nothing."""
    if name in COUNT_KEYS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{name} must be a positive integer, got {value!r}"
        return ""
    if current is None:
        return ""
    if isinstance(current, bool):
        expected, fits = "true or false", isinstance(value, bool)
    elif isinstance(current, int):
        expected, fits = "an integer", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(current, float):
        expected, fits = "a number", isinstance(value, int | float) and not isinstance(value, bool)
    else:
        expected, fits = "a string", isinstance(value, str)
    return "" if fits else f"{name} must be {expected} (the config has {current!r}), got {value!r}"


def _pretrained_problems(model_name: str, overrides: dict[str, Override], config: dict, where: str) -> list[str]:
    """The overrides a pretrained checkpoint cannot take: a weight's shape changed, more layers than it has."""
    if not is_pretrained(model_name):
        return []
    problems = [
        f"{OVERRIDES_KEY}: {name!r} changes the shape of the weights of the pretrained model {model_name!r}{where}, "
        "which could then not be loaded; a shape study takes a random:<architecture> model"
        for name in overrides
        if name in WEIGHT_SHAPE_KEYS
    ]
    layers, checkpoint_layers = overrides.get(LAYER_COUNT_KEY), config.get(LAYER_COUNT_KEY)
    if isinstance(layers, int) and isinstance(checkpoint_layers, int) and layers > checkpoint_layers:
        problems.append(
            f"{OVERRIDES_KEY}: {LAYER_COUNT_KEY}={layers} is more than the {checkpoint_layers} layers of the "
            f"pretrained model {model_name!r}{where}: the layers beyond would have no weights"
        )
    return problems


def apply_config_overrides(config: dict, overrides: dict[str, Override]) -> dict:
    """`config` (a config as a dict) with `overrides` set, and what follows from them: a key transformers keeps in
    the RoPE parameters is set there; a `head_dim` that was hidden_size / num_attention_heads follows a new width
    or head count; a per-layer list (`layer_types`) follows a new layer count (cut to it, or left to the config
    class's default when there are more layers)."""
    merged = dict(config)
    rope = dict(config.get(ROPE_PARAMETERS_KEY) or {})
    for name, value in overrides.items():
        if name not in config and name in rope:
            rope[name] = value
            merged[ROPE_PARAMETERS_KEY] = rope
        else:
            merged[name] = value
    head_dim, hidden, heads = config.get("head_dim"), config.get("hidden_size"), config.get("num_attention_heads")
    derived_head_dim = isinstance(hidden, int) and isinstance(heads, int) and heads and head_dim == hidden // heads
    if "head_dim" not in overrides and derived_head_dim and {"hidden_size", "num_attention_heads"} & set(overrides):
        merged["head_dim"] = merged["hidden_size"] // merged["num_attention_heads"]
    layers = overrides.get(LAYER_COUNT_KEY)
    if isinstance(layers, int):
        for name, value in config.items():
            if name not in overrides and isinstance(value, list) and len(value) == config.get(LAYER_COUNT_KEY):
                if layers <= len(value):
                    merged[name] = value[:layers]
                else:
                    del merged[name]
    return merged


def _check_overridden_model(model_name: str, merged: dict, where: str) -> None:
    """A model the overridden config can make: a config transformers accepts (its strict validation: field types,
    the width a multiple of the head count), then grouped-query heads that share the query heads out evenly."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    params = {name: value for name, value in merged.items() if name != "model_type"}
    try:
        AutoConfig.for_model(merged["model_type"], **params)
    except (StrictDataclassError, ValueError, TypeError) as exc:  # transformers' validation: its words, on one line
        reason = " ".join(line.strip() for line in str(exc.__cause__ or exc).splitlines() if line.strip())
        raise SpecError(
            f"{OVERRIDES_KEY}: transformers refuses the overridden config of {model_name!r}{where}: {reason}"
        ) from None
    heads, kv_heads = merged.get("num_attention_heads"), merged.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise SpecError(
            f"{OVERRIDES_KEY}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads}) "
            f"in the overridden config of {model_name!r}{where}: each key/value head serves a whole group of query "
            "heads"
        )
