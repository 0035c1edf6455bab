"""scripts/comm_overlap.py: the communication a trace's computation hides, and what it leaves exposed."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from comm_overlap import overlap_summary  # noqa: E402


def kernel(name: str, start_us: float, dur_us: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": start_us, "dur": dur_us}


def test_communication_under_computation_is_hidden_and_the_rest_exposed():
    events = [
        kernel("ampere_bf16_gemm", 0, 100),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 80),  # 50 under the gemm, 30 past it
        kernel("elementwise_kernel", 140, 10),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 150, 20),  # after the last computation: the tail
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # not a kernel
    ]
    summary = overlap_summary(events, steps=2)
    assert summary["compute_s"] == pytest.approx(110e-6 / 2)
    assert summary["comm_s"] == pytest.approx(100e-6 / 2)
    assert summary["exposed_comm_s"] == pytest.approx(50e-6 / 2)
    assert summary["busy_s"] == pytest.approx(160e-6 / 2)
    assert summary["comm_tail_s"] == pytest.approx(20e-6)
    assert summary["comm_kernels"] == 1
