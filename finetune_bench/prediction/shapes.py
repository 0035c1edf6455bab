"""A model's shape, read from its config: the sizes the memory and time predictions are made of.

The config comes from a bundled architecture (`random:<name>`), a local model directory's config.json, a hub
id that a bundled architecture was copied from (its `_name_or_path`), or a downloaded model directory. No
weights are read and nothing is built: a shape is a handful of integers and the list of linear layers of
one decoder layer, which is what parameters, LoRA adapters and saved activations are counted from.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from finetune_bench.inputs.catalog import (
    RANDOM_PREFIX,
    architecture_config,
    architectures,
    looks_like_path,
)
from finetune_bench.inputs.model_overrides import apply_config_overrides, parse_config_overrides


class NoPrediction(ValueError):
    """A condition the models here cannot predict; the message says why (shown instead of a figure)."""


# The decoder families whose layers the memory model knows, op by op (transformers' implementations of
# these model types): Llama-style layers with separate q/k/v and gate/up projections, and Phi-3's fused ones.
SEPARATE_PROJECTIONS = ("llama", "mistral", "qwen2")
FUSED_PROJECTIONS = ("phi3",)
MODELLED_TYPES = SEPARATE_PROJECTIONS + FUSED_PROJECTIONS


@dataclass(frozen=True)
class Linear:
    """One linear layer of a decoder layer: its name (the module name LoRA targets), sizes, and which
    activation it reads (`attention_input`, `attention_output`, `mlp_input` or `mlp_product`)."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    reads: str


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model, and its decoder layer's linear layers."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    # q, k and v come out of one projection (Phi-3's qkv_proj), so v is a view that keeps all three alive.
    fused_qkv: bool
    linears: tuple[Linear, ...]

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: its linear layers (weights and biases) and its two norms."""
        linear = sum(x.in_features * x.out_features + (x.out_features if x.bias else 0) for x in self.linears)
        return linear + 2 * self.hidden_size

    @property
    def head_parameters(self) -> int:
        """The LM head's own parameters (0 when it shares the input embedding's)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def parameters(self) -> int:
        """Every parameter: embedding, decoder layers, final norm, LM head (counted once when tied)."""
        embedding = self.vocab_size * self.hidden_size
        return embedding + self.num_layers * self.layer_parameters + self.hidden_size + self.head_parameters

    @property
    def matmul_parameters(self) -> int:
        """Weights that take part in a matrix multiply per token (the N of 6·N): every linear weight and the
        LM head (also when tied), not the embedding lookup, biases or norms."""
        layer = sum(x.in_features * x.out_features for x in self.linears)
        return self.num_layers * layer + self.vocab_size * self.hidden_size

    def lora_targets(self, target_modules: str) -> tuple[Linear, ...]:
        """The linear layers of one decoder layer that `lora_target_modules` adapts (peft's "all-linear":
        every linear layer but the LM head)."""
        if target_modules == "all-linear":
            return self.linears
        names = {name.strip() for name in target_modules.split(",")}
        return tuple(x for x in self.linears if x.name in names)

    def lora_parameters(self, rank: int, target_modules: str) -> int:
        """The adapters' parameters: rank · (in + out) per adapted linear layer, in every decoder layer."""
        if rank <= 0:
            return 0
        per_layer = sum(rank * (x.in_features + x.out_features) for x in self.lora_targets(target_modules))
        return self.num_layers * per_layer


def model_config(model_name: str, model_dir: Path | None = None, overrides: str = "") -> dict:
    """The config of `model_name` as a dict, with `overrides` (`TrainingArgs.model_config_overrides`) applied as a
    run applies them: from the downloaded `model_dir` when given, else a bundled architecture, a local directory, or
    a hub id a bundled architecture was copied from. NoPrediction when none of these has it (a hub id seen nowhere
    here: its config is read once it is downloaded)."""
    return apply_config_overrides(_source_config(model_name, model_dir), parse_config_overrides(overrides))


def _source_config(model_name: str, model_dir: Path | None) -> dict:
    """The config of `model_name` as it was prepared, before any override."""
    if model_dir is not None and (Path(model_dir) / "config.json").is_file():
        return json.loads((Path(model_dir) / "config.json").read_text())
    if model_name.startswith(RANDOM_PREFIX):
        return architecture_config(model_name.removeprefix(RANDOM_PREFIX))
    if looks_like_path(model_name):
        path = Path(model_name).expanduser() / "config.json"
        if path.is_file():
            return json.loads(path.read_text())
        raise NoPrediction(f"no config.json in {model_name!r}")
    for name in architectures():
        config = architecture_config(name)
        if str(config.get("_name_or_path", "")).lower() == model_name.lower():
            return config
    raise NoPrediction(
        f"the config of {model_name!r} is not known here (it is read when the model is downloaded; the bundled "
        f"architectures cover {sorted(_hub_ids())})"
    )


def _hub_ids() -> set[str]:
    ids = {str(architecture_config(name).get("_name_or_path", "")) for name in architectures()}
    return {i for i in ids if "/" in i and " " not in i}


def model_shape(config: dict) -> ModelShape:
    """The shape of a model of a modelled family from its config; NoPrediction for any other."""
    model_type = config.get("model_type", "")
    text = config.get("text_config") or config
    if model_type not in MODELLED_TYPES:
        raise NoPrediction(f"no memory model for model type {model_type!r} (modelled: {list(MODELLED_TYPES)})")
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    intermediate = int(text["intermediate_size"])
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    if model_type in FUSED_PROJECTIONS:
        linears = (
            Linear("qkv_proj", hidden, q_width + 2 * kv_width, False, "attention_input"),
            Linear("o_proj", q_width, hidden, False, "attention_output"),
            Linear("gate_up_proj", hidden, 2 * intermediate, False, "mlp_input"),
            Linear("down_proj", intermediate, hidden, False, "mlp_product"),
        )
    else:
        qkv_bias = bool(text.get("attention_bias", False)) or model_type == "qwen2"
        out_bias = bool(text.get("attention_bias", False))
        mlp_bias = bool(text.get("mlp_bias", False))
        linears = (
            Linear("q_proj", hidden, q_width, qkv_bias, "attention_input"),
            Linear("k_proj", hidden, kv_width, qkv_bias, "attention_input"),
            Linear("v_proj", hidden, kv_width, qkv_bias, "attention_input"),
            Linear("o_proj", q_width, hidden, out_bias, "attention_output"),
            Linear("gate_proj", hidden, intermediate, mlp_bias, "mlp_input"),
            Linear("up_proj", hidden, intermediate, mlp_bias, "mlp_input"),
            Linear("down_proj", intermediate, hidden, mlp_bias, "mlp_product"),
        )
    return ModelShape(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=int(text["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(text["vocab_size"]),
        tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        fused_qkv=model_type in FUSED_PROJECTIONS,
        linears=linears,
    )
