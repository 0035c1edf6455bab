"""Gradient checkpointing is torch's non-reentrant kind in every backend, stated rather than left to transformers'
default, and switched on without transformers' deprecation warnings (5.23 renamed it activation checkpointing); a
compiled run says what torch.compile captured."""

import warnings

import transformers

from finetune_bench.running.backends.common import CHECKPOINTING_KWARGS, enable_activation_checkpointing
from finetune_bench.running.backends.trainer_common import checkpointing_arguments


def _tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, use_cache=False,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def test_the_plain_loop_checkpoints_every_layer_non_reentrant_without_a_deprecation_warning():
    model = _tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model)
    assert CHECKPOINTING_KWARGS == {"use_reentrant": False}
    for layer in model.model.layers:
        assert layer.gradient_checkpointing
        assert layer._gradient_checkpointing_func.keywords["use_reentrant"] is False


def test_the_trainers_checkpoint_non_reentrant_without_a_deprecation_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        arguments = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", **checkpointing_arguments(True)
        )
    assert arguments.gradient_checkpointing is True  # the old name mirrors the new where both exist
    assert arguments.gradient_checkpointing_kwargs == {"use_reentrant": False}
    off = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **checkpointing_arguments(False))
    assert off.gradient_checkpointing is False


def test_a_compiled_run_says_what_dynamo_captured_and_where_it_broke():
    """The compile arms' details (`compile_details`): graphs, graph breaks and their reasons, so that a compiled run
    that dynamo could not trace whole says where."""
    import torch
    from torch._dynamo.utils import counters

    from finetune_bench.running.backends.common import compile_details

    counters.clear()
    assert compile_details() == {
        "compile_graphs": 0, "compile_graph_breaks": 0, "compile_graph_break_reasons": ""
    }  # fmt: skip

    def broken(x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) + 1
        torch._dynamo.graph_break()
        return torch.cos(y) * 2

    torch.compile(broken, backend="eager")(torch.ones(3))
    details = compile_details()
    assert (details["compile_graphs"], details["compile_graph_breaks"]) == (2, 1)
    assert details["compile_graph_break_reasons"] == "Call to `torch._dynamo.graph_break()` (×1)"
    counters.clear()


def test_unreadable_dynamo_counters_cost_the_details_not_the_run(monkeypatch):
    import torch._dynamo.utils

    from finetune_bench.running.backends.common import compile_details

    class Broken:
        def __getitem__(self, key: str) -> object:
            raise KeyError(key)

    monkeypatch.setattr(torch._dynamo.utils, "counters", Broken())
    assert compile_details() == {
        "compile_details_error": "dynamo's counters could not be read: KeyError('graph_break')"
    }
