"""Run by tests/running/test_float16_mixed_precision.py in a process of its own (Liger runs in the Triton
interpreter, which must be switched on before Triton is imported, and its patches are process-wide): every loss the
plain loop computes, under CPU float16 autocast with float32 weights and a loss scale, against the same loss in
float32. Prints one JSON line: per criterion the loss, its dtype, whether every gradient is finite and the relative
error of the LM head's and the first layer's gradients.

    python float16_loss_check.py MODEL_DIR
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from finetune_bench.running.triton_cpu import install_interpreter_shims  # noqa: E402

install_interpreter_shims()

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from finetune_bench.running.backends.plain_loop import loss_function  # noqa: E402
from finetune_bench.running.liger_patching import apply_liger, loss_path  # noqa: E402

SCALE = 2.0**16  # torch.amp.GradScaler's initial scale
CHECKED = ("lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight")


def gradients(model: torch.nn.Module, criterion: str, batch: dict, amp: bool, mixed_float16: bool) -> dict:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
        loss = loss_function(criterion, mixed_float16)(model, batch)
    (loss.float() * (SCALE if amp else 1.0)).backward()  # as LossScaling.backward scales it
    grads = {n: p.grad.detach() / (SCALE if amp else 1.0) for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": float(loss.detach()), "dtype": str(loss.dtype).removeprefix("torch."), "grads": grads}


def compare(result: dict, reference: dict) -> dict:
    grads = result.pop("grads")
    result["finite"] = all(bool(g.isfinite().all()) for g in grads.values())
    result["gradient_dtypes"] = sorted({str(g.dtype).removeprefix("torch.") for g in grads.values()})
    result["relative_error"] = {
        name: float((grads[name] - reference["grads"][name]).norm() / reference["grads"][name].norm())
        for name in CHECKED
    }
    return result


def main(model_dir: str) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32).train()
    ids = torch.randint(0, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :8] = -100  # a prompt that is not scored, as the data's
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    reference = gradients(model, "torch_cross_entropy", batch, amp=False, mixed_float16=False)
    out = {"reference_loss": reference["loss"]}
    for criterion in ("model", "torch_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy", "cce"):
        out[criterion] = compare(gradients(model, criterion, batch, amp=True, mixed_float16=True), reference)
    # Liger's cross entropy on the float16 logits (its form outside float16 mixed precision): the loss scale
    # overflows its float16 gradient
    out["liger_cross_entropy_on_float16_logits"] = compare(
        gradients(model, "liger_cross_entropy", batch, amp=True, mixed_float16=False), reference
    )
    # the model's own loss in a liger arm: Liger's fused linear cross entropy in the patched forward
    apply_liger(model, rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True, cross_entropy=False)
    out["model_liger_fused"] = compare(gradients(model, "model", batch, amp=True, mixed_float16=True), reference)
    out["model_liger_fused"]["loss_path"] = loss_path(model, "model").name
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
