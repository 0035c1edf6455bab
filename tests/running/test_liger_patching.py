import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from finetune_bench.inputs.arms import supported_model_types
from finetune_bench.running.liger_patching import LigerNotApplied, apply_liger, patch_report

# Liger patches module-wide: undo it after each test, so later tests build vanilla models.
pytestmark = pytest.mark.usefixtures("undo_liger_patches")


def test_supported_types_come_from_liger():
    assert {"llama", "phi3", "qwen2", "mistral", "gemma2"} <= set(supported_model_types())


def test_unpatchable_model_type_is_refused():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    with pytest.raises(LigerNotApplied, match="'gpt2'"):
        apply_liger(model)


def test_patch_report_counts_what_liger_replaced():
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=64
    )
    model = LlamaForCausalLM(config)
    assert patch_report(model) == {}
    report = apply_liger(model, fused_linear_cross_entropy=False, cross_entropy=False)
    assert report["LigerRMSNorm"] == 2 * 2 + 1  # two per layer and the final norm
    assert report["LigerSwiGLUMLP"] == 2
    assert isinstance(model.model.norm.weight, torch.nn.Parameter)


def _compile_check(model_dir, mode: str) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "compile_liger_check.py"
    done = subprocess.run(
        [sys.executable, str(script), str(model_dir), mode], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


# slow: torch.compile's graphs built on a CPU, half a minute of both cores
@pytest.mark.slow
def test_compiled_liger_runs_its_kernels_eagerly_between_the_graphs(tiny_model_dir):
    """compile+liger: dynamo must not trace Liger's kernels (traced, they gave wrong losses on a GPU); kept out,
    the compiled model computes exactly what the eager one does, and the rest of the model is still captured."""
    kept = _compile_check(tiny_model_dir, "keep")
    assert kept["error"] == ""
    assert {"LigerFusedLinearCrossEntropyFunction", "LigerRMSNormFunction", "LigerSiLUMulFunction"} <= set(
        kept["kept_out"]
    )
    assert kept["liger_or_triton_targets"] == []
    assert kept["graphs"] > 0  # the decoder's other operations are compiled
    assert kept["compiled"] == pytest.approx(kept["eager"], rel=1e-6)
    traced = _compile_check(tiny_model_dir, "trace")
    # Without it dynamo goes into Liger's kernels (here it fails inside the Triton interpreter they run in)
    assert traced["error"] or traced["liger_or_triton_targets"], traced
