"""`model_config_overrides`: parsed and refused at planning (or, for a hub model, before launch) with messages that
name the key; applied to the built model, the memory model, the FLOPs count, the results store's key and the
results table; carried through Flyte's literals."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.model_overrides import apply_config_overrides, parse_config_overrides
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs

LLAMA_8B = "random:llama-3-8b"
LLAMA_KEYS = (
    "attention_bias, attention_dropout, head_dim, hidden_act, hidden_size, initializer_range, intermediate_size, "
    "max_position_embeddings, mlp_bias, num_attention_heads, num_hidden_layers, num_key_value_heads, "
    "pretraining_tp, rms_norm_eps, rope_theta, tie_word_embeddings, use_cache, vocab_size"
)
KEY = "training_args.model_config_overrides"


def problems_of(overrides: str, model_name: str = LLAMA_8B, **experiment: list) -> list[str]:
    with pytest.raises(SpecError) as refused:
        plan_runs(
            ExperimentArgs(**experiment),
            TrainingArgs(model_name=model_name, model_config_overrides=overrides),
            1,
        )
    return refused.value.problems


def test_the_string_form_parses_into_typed_values():
    assert parse_config_overrides(" num_hidden_layers=8 , rope_theta=5.0e5,hidden_act=gelu,mlp_bias=true") == {
        "num_hidden_layers": 8,
        "rope_theta": 500000.0,
        "hidden_act": "gelu",
        "mlp_bias": True,
    }
    assert parse_config_overrides("") == {} and parse_config_overrides("  ") == {}
    assert isinstance(parse_config_overrides("num_hidden_layers=8")["num_hidden_layers"], int)


def test_a_valid_override_plans_and_is_kept_on_every_run():
    runs = plan_runs(
        ExperimentArgs(arm=["baseline", "liger"]),
        TrainingArgs(model_name=LLAMA_8B, model_config_overrides="num_hidden_layers=8"),
        2,
    )
    assert {run.training_args.model_config_overrides for run in runs} == {"num_hidden_layers=8"}


def test_an_unknown_key_is_refused_naming_it_the_closest_and_the_known_ones():
    assert problems_of("num_layers=8") == [
        f"{KEY}: 'num_layers' is not a config key of 'random:llama-3-8b' (did you mean 'num_hidden_layers'?); "
        f"its keys: {LLAMA_KEYS}"
    ]


def test_the_syntax_is_refused_every_problem_at_once():
    assert problems_of("num_hidden_layers,=3,a=1,a=2") == [
        f"{KEY}: 'num_hidden_layers' is not a key=value pair (write e.g. "
        "'num_hidden_layers=8,intermediate_size=14336')",
        f"{KEY}: '=3' is not a key=value pair (write e.g. 'num_hidden_layers=8,intermediate_size=14336')",
        f"{KEY}: 'a' is given twice",
    ]
    assert problems_of("rope_theta=nan") == [f"{KEY}: rope_theta=nan is not a finite number"]


def test_values_of_the_wrong_type_are_refused_naming_the_key_and_the_config_s_value():
    assert problems_of("num_hidden_layers=8.5,rope_theta=fast,hidden_act=3,attention_bias=1,num_hidden_layers2=1") == [
        f"{KEY}: num_hidden_layers must be a positive integer, got 8.5",
        f"{KEY}: rope_theta must be a number (the config has 500000.0), got 'fast'",
        f"{KEY}: hidden_act must be a string (the config has 'silu'), got 3",
        f"{KEY}: attention_bias must be true or false (the config has False), got 1",
        f"{KEY}: 'num_hidden_layers2' is not a config key of 'random:llama-3-8b' (did you mean 'num_hidden_layers'?); "
        f"its keys: {LLAMA_KEYS}",
    ]
    assert problems_of("num_hidden_layers=0") == [f"{KEY}: num_hidden_layers must be a positive integer, got 0"]


def test_keys_no_override_may_set_are_refused_with_the_reason():
    assert problems_of("model_type=gpt2,pad_token_id=0,torch_dtype=float16") == [
        f"{KEY}: 'model_type' cannot be overridden: it names the model class; choose another model_name instead",
        f"{KEY}: 'pad_token_id' cannot be overridden: the tokenizer's special tokens decide it",
        f"{KEY}: 'torch_dtype' cannot be overridden: the dtype is training_args.dtype",
    ]


def test_a_model_the_overridden_config_cannot_make_is_refused_in_transformers_words():
    assert problems_of("num_attention_heads=7") == [
        f"{KEY}: transformers refuses the overridden config of 'random:llama-3-8b': The hidden size (4096) is not a "
        "multiple of the number of attention heads (7)."
    ]
    assert problems_of("num_key_value_heads=5") == [
        f"{KEY}: num_attention_heads (32) is not a multiple of num_key_value_heads (5) in the overridden config of "
        "'random:llama-3-8b': each key/value head serves a whole group of query heads"
    ]


def test_a_pretrained_hub_model_is_refused_keys_that_reshape_its_weights_at_planning():
    assert problems_of("hidden_size=1024,num_hidden_layers=4", model_name="meta-llama/Meta-Llama-3-8B") == [
        f"{KEY}: 'hidden_size' changes the shape of the weights of the pretrained model 'meta-llama/Meta-Llama-3-8B', "
        "which could then not be loaded; a shape study takes a random:<architecture> model"
    ]


def test_a_sweep_of_override_sets_has_readable_condition_ids_and_names_the_condition_at_fault():
    runs = plan_runs(
        ExperimentArgs(model_config_overrides=["num_hidden_layers=4", "num_hidden_layers=8,intermediate_size=8192"]),
        TrainingArgs(model_name=LLAMA_8B),
        1,
    )
    assert [run.condition_id for run in runs] == [
        "model_config_overrides=num_hidden_layers=4",
        "model_config_overrides=num_hidden_layers=8,intermediate_size=8192",
    ]
    assert problems_of("", model_config_overrides=["num_hidden_layers=4", "num_heads=2"]) == [
        f"{KEY}: 'num_heads' is not a config key of 'random:llama-3-8b' (condition model_config_overrides=num_heads=2) "
        f"(did you mean 'num_key_value_heads'?); its keys: {LLAMA_KEYS}"
    ]
    assert problems_of("", model_config_overrides=["num_hidden_layers=4", "layers"]) == [
        "experiment_args.model_config_overrides: 'layers' is not a key=value pair (write e.g. "
        "'num_hidden_layers=8,intermediate_size=14336')"
    ]


def test_a_new_width_carries_a_derived_head_dim_and_a_new_layer_count_cuts_per_layer_lists():
    config = {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "num_hidden_layers": 4}
    assert apply_config_overrides(config, {"hidden_size": 2048})["head_dim"] == 64
    assert apply_config_overrides({**config, "head_dim": 256}, {"hidden_size": 2048})["head_dim"] == 256
    layered = {**config, "layer_types": ["sliding", "full", "sliding", "full"]}
    assert apply_config_overrides(layered, {"num_hidden_layers": 2})["layer_types"] == ["sliding", "full"]
    assert "layer_types" not in apply_config_overrides(layered, {"num_hidden_layers": 6})
    rope = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    assert apply_config_overrides(rope, {"rope_theta": 5.0})["rope_parameters"]["rope_theta"] == 5.0


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    from finetune_bench.sources.models import prepare_model

    return prepare_model("random:tiny-llama", root=tmp_path_factory.mktemp("models"))


TINY_OVERRIDES = "num_hidden_layers=3,hidden_size=128,intermediate_size=96,rope_theta=500.0"


def test_a_tiny_random_model_builds_with_the_overridden_shape_and_its_directory_is_unchanged(tiny_model_dir):
    from finetune_bench.running.backends.common import load_model
    from finetune_bench.sources.models import model_destination

    on_disk = (tiny_model_dir / "config.json").read_text()
    args = TrainingArgs(model_config_overrides=TINY_OVERRIDES, device="cpu")
    model = load_model(args, tiny_model_dir, torch.device("cpu"), torch.float32).model
    assert len(model.model.layers) == 3
    assert model.config.hidden_size == 128 and model.config.head_dim == 32  # 64 / 4 heads before, 128 / 4 now
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (96, 128)
    assert model.config.rope_parameters["rope_theta"] == 500.0
    plain = load_model(TrainingArgs(device="cpu"), tiny_model_dir, torch.device("cpu"), torch.float32).model
    assert len(plain.model.layers) == 2 and plain.config.hidden_size == 64
    # the prepared model (the download cache) is the same whatever the overrides
    assert (tiny_model_dir / "config.json").read_text() == on_disk
    assert model_destination(args.model_name) == model_destination(TrainingArgs().model_name)


def test_the_memory_model_and_the_flops_count_use_the_overridden_shape(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from finetune_bench.measuring.flops import matmul_parameters, training_flops_per_token
    from finetune_bench.prediction.grid import shape_of
    from finetune_bench.prediction.shapes import model_config, model_shape
    from finetune_bench.sources.models import load_model_config

    eight = model_shape(model_config(LLAMA_8B, overrides="num_hidden_layers=8"))
    full = model_shape(model_config(LLAMA_8B))
    assert (eight.num_layers, full.num_layers) == (8, 32) and eight.hidden_size == full.hidden_size == 4096
    assert eight.parameters == full.parameters - 24 * full.layer_parameters
    assert shape_of(TrainingArgs(model_name=LLAMA_8B, model_config_overrides="num_hidden_layers=8"))[0] == eight

    # the shape the prediction reads from the prepared directory is the built model's
    predicted = model_shape(model_config("random:tiny-llama", tiny_model_dir, TINY_OVERRIDES))
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(load_model_config(tiny_model_dir, TINY_OVERRIDES))
        plain = AutoModelForCausalLM.from_config(load_model_config(tiny_model_dir))
    assert predicted.num_layers == 3 and predicted.hidden_size == 128
    assert matmul_parameters(built) == predicted.matmul_parameters != matmul_parameters(plain)
    seq = 32
    assert training_flops_per_token(built, seq) == 6 * predicted.matmul_parameters + 12 * 3 * 128 * seq


def test_the_results_store_key_and_the_results_table_carry_the_overrides():
    from finetune_bench.analysis.tables import results_table
    from finetune_bench.results.store import run_key

    def planned(overrides: str) -> PlannedRun:
        args = TrainingArgs(model_name=LLAMA_8B, model_config_overrides=overrides)
        return PlannedRun(condition_id="baseline", run_number=0, training_args=args, swept_axes=[])

    keys = {run_key(planned(o), "cpu") for o in ("", "num_hidden_layers=8", "num_hidden_layers=4")}
    assert len(keys) == 3
    table = results_table([planned("num_hidden_layers=8")], [None])
    assert table.loc[0, "model_config_overrides"] == "num_hidden_layers=8"


def test_a_hub_model_s_overrides_are_checked_on_its_downloaded_config_before_launch(tmp_path):
    from finetune_bench.inputs.catalog import architecture_config
    from finetune_bench.running.preflight import refuse_invalid_overrides

    (tmp_path / "config.json").write_text(json.dumps(architecture_config("llama-3-8b")))
    base = TrainingArgs(model_name="someone/llama-like")
    runs = [
        PlannedRun(f"c{i}", 0, dataclasses.replace(base, model_config_overrides=o), ["model_config_overrides"])
        for i, o in enumerate(["", "num_hidden_layers=8", "num_hidden_layers=40", "num_layer=2"])
    ]
    checked = refuse_invalid_overrides(runs, tmp_path)
    assert [run.refused for run in checked[:2]] == ["", ""]
    assert checked[2].refused == (
        f"not launched: {KEY}: num_hidden_layers=40 is more than the 32 layers of the pretrained model "
        "'someone/llama-like': the layers beyond would have no weights (checked on the downloaded model's config "
        "before any run)"
    )
    assert checked[3].refused.startswith(
        f"not launched: {KEY}: 'num_layer' is not a config key of 'someone/llama-like' (did you mean "
        "'num_hidden_layers'?); its keys: "
    )


def test_the_setting_survives_flyte_s_literals():
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    context = FlyteContextManager.current_context()
    for cls, value in [
        (TrainingArgs, TrainingArgs(model_config_overrides="num_hidden_layers=8,rope_theta=5.0e5")),
        (ExperimentArgs, ExperimentArgs(model_config_overrides=["num_hidden_layers=4", "num_hidden_layers=8"])),
    ]:
        literal = TypeEngine.to_literal(context, value, cls, TypeEngine.to_literal_type(cls))
        assert TypeEngine.to_python_value(context, literal, cls) == value


def test_the_inputs_file_of_llama_3_8b_widths_plans_8_layers():
    import yaml

    inputs = yaml.safe_load((Path(__file__).resolve().parents[2] / "inputs" / "stacks_llama8b_width.yaml").read_text())
    runs = plan_runs(
        ExperimentArgs(**inputs["experiment_args"]), TrainingArgs(**inputs["training_args"]), inputs["n_runs"]
    )
    from finetune_bench.prediction.grid import shape_of

    shape, _ = shape_of(runs[0].training_args)
    assert shape is not None and (shape.num_layers, shape.hidden_size, shape.intermediate_size) == (8, 4096, 14336)
