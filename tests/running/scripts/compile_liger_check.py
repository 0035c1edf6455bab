"""Run by tests/running/test_liger_patching.py in a process of its own (the replacement it checks is
process-wide): a tiny Llama with Liger's kernels (Triton interpreter, CPU), compiled with a backend that keeps
dynamo's graphs, trained one step. Prints a JSON line: eager and compiled losses and gradient norms, the graphs'
call targets that name Triton or Liger, and the Functions kept out.

    python compile_liger_check.py MODEL_DIR keep|trace
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from finetune_bench.running.triton_cpu import install_interpreter_shims  # noqa: E402

install_interpreter_shims()

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from finetune_bench.running.liger_patching import apply_liger, keep_liger_out_of_compiled_graphs  # noqa: E402


def one_step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, float]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    return float(loss.detach()), float(grad_norm)


model_dir, mode = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32).train()
apply_liger(model, rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True, cross_entropy=False)
# one row of 8 tokens: each Liger kernel runs in the Triton interpreter, at a cost per row
ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
eager = one_step(model, ids)
kept_out = keep_liger_out_of_compiled_graphs() if mode == "keep" else []
graphs = []


def record(graph_module: torch.fx.GraphModule, _inputs: list) -> object:
    graphs.append(graph_module)
    return graph_module.forward


model.compile(backend=record)
try:
    compiled, error = one_step(model, ids), ""
except Exception as exc:  # what tracing Liger's kernels does (reported, the test decides)
    compiled, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
targets = sorted({str(node.target) for graph in graphs for node in graph.graph.nodes if node.op == "call_function"})
print(
    json.dumps(
        {
            "eager": eager,
            "compiled": compiled,
            "error": error,
            "graphs": len(graphs),
            "liger_or_triton_targets": [t for t in targets if "triton" in t.lower() or "liger" in t.lower()],
            "kept_out": kept_out,
        }
    )
)
