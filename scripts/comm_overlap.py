"""How much of the GPU's collective communication hides behind computation, from a PyTorch profiler trace.

    python scripts/comm_overlap.py TRACE.json --steps N

TRACE.json is a chrome trace of N training steps on one GPU (`scripts/hand_loop.py --profile-dir`, one folder a
rank under torchrun; or a benchmark run's `profile: true`). Kernels whose name says NCCL are communication, every
other kernel computation. Prints one JSON line, seconds per step: the GPU's busy time, computation, communication,
the communication that ran while no computation did (`exposed_comm_s`: what overlap failed to hide, the time a
data-parallel step loses to its all-reduce beyond the computation's own slowdown), and the last communication
kernel's end after the last computation kernel before it (`comm_tail_s`: the all-reduce left after the backward).
"""

import argparse
import json


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `intervals`, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The total length of the overlap of two sorted disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_summary(events: list[dict], steps: int) -> dict[str, float]:
    """Per-step busy, computation, communication, exposed communication and tail seconds of the kernels in
    `events` (chrome trace events; times in microseconds)."""
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        raise SystemExit("the trace has no GPU kernels (profiled on a CPU?)")
    comm = merged([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()])
    compute = merged([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
    comm_s, compute_s = length(comm), length(compute)
    hidden = intersection(comm, compute)
    tail = 0.0
    if comm and compute:
        last_compute_before = max((end for start, end in compute if start < comm[-1][1]), default=comm[-1][0])
        tail = max(0.0, comm[-1][1] - last_compute_before)
    scale = 1e-6 / steps
    return {
        "busy_s": length(merged(comm + compute)) * scale,
        "compute_s": compute_s * scale,
        "comm_s": comm_s * scale,
        "exposed_comm_s": (comm_s - hidden) * scale,
        "comm_tail_s": tail * 1e-6,  # of the last step
        "comm_kernels": sum(1 for e in kernels if "nccl" in e["name"].lower()) / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, required=True, help="how many steps the trace holds")
    opts = parser.parse_args()
    with open(opts.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    print(json.dumps({"trace": opts.trace, **overlap_summary(events, opts.steps)}))


if __name__ == "__main__":
    main()
