"""The frontier report of a run on the fake memory model (`make frontier`'s CPU smoke run): what was measured, its
out-of-memory results named as simulated beside every figure they make, CPU seconds, and a probes figure that draws an
out-of-memory probe where its caption says, and tables that fit a page 1400 px wide."""

import dataclasses
import re

from finetune_bench.frontier.report import build_frontier_report
from finetune_bench.frontier.search import ProbeOutcome, search_frontier
from finetune_bench.frontier.settings import SEQ_LENGTH
from finetune_bench.frontier.tables import frontier_table, probes_table
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.faults import FAKE_MEMORY_ENV
from tests.frontier.test_frontier import GIB, FakeProbe, make_search
from tests.reporting.test_wide_tables import needs_chromium, table_widths


class FakeMemoryProbe(FakeProbe):
    """The fake memory model on a CPU, as `make frontier` runs it: an out-of-memory probe says the fake memory model
    stopped it, and measured some host memory before it did; an ok probe measured host memory only."""

    def __call__(self, args: TrainingArgs) -> ProbeOutcome:
        value = getattr(args, self.dimension)
        self.calls.append(value)
        cpu = {"device_type": "cpu", "cpu": "x86_64", "torch": "2.13.0+cpu", "liger-kernel": "0.8.5",
               "lock_sha256": "12ab43339895acd68ee9ca0f24045b651d0ea26c"}  # fmt: skip
        rss = (0.5 + value / 1000) * GIB
        when = f"2026-11-27 09:{len(self.calls):02d} UTC"
        if value > self.threshold:
            reason = f"out of memory at step 1: CUDA out of memory (fake memory model: {2 * value} > 64 token units)"
            return ProbeOutcome(
                status="oom", reason=reason, wall_time_s=3.0, process_peak_rss_bytes=rss / 2, measured_at=when
            )
        return ProbeOutcome(status="ok", wall_time_s=3.0, process_peak_rss_bytes=rss, environment=cpu, measured_at=when)


def _simulated_report():
    searches = [
        make_search(SEQ_LENGTH, start=32, cap=64, granularity=32, liger=True),
        make_search(SEQ_LENGTH, start=32, cap=64, granularity=32, liger=False),
    ]
    tiny = {"model_name": "random:tiny-llama", "backend": "plain_loop"}
    searches = [dataclasses.replace(s, training_args=dataclasses.replace(s.training_args, **tiny)) for s in searches]
    results = [
        search_frontier(searches[0], FakeMemoryProbe(64, SEQ_LENGTH)),
        search_frontier(searches[1], FakeMemoryProbe(32, SEQ_LENGTH)),
    ]
    return searches, results, build_frontier_report(searches, results, inputs_file="inputs/frontier_smoke.yaml")


def test_a_frontier_on_the_fake_memory_model_says_its_out_of_memory_is_simulated_and_its_seconds_cpu_seconds():
    searches, results, report = _simulated_report()
    html = report.to_html(title="Memory frontier")
    summary = report.sections["Frontier"]
    # the answer at a glance (a card per arm), then what was measured
    assert summary.startswith('<div class="cards"><div class="card">')
    assert summary.index('<div class="measured"><details><summary><b>What was measured</b>') < summary.index("</ul>")
    header = dict(re.findall(r"<li>(.*?): (.*?)</li>", summary.split("</ul>", 1)[0]))
    assert header == {
        "hardware": "CPU (x86_64)",
        "memory": f"simulated: the fake memory model ({FAKE_MEMORY_ENV}=64) runs a probe out of memory, not the device",
        "model": "random:tiny-llama",
        "dataset": "synthetic:alpaca",
        "backend": "plain_loop",
        "dtype": "auto",
        "searched": "sequence length 32 to 64 in steps of 32 at per_device_train_batch_size=1",
        "steps": "2 per probe",
        "measured": "2026-11-27 09:01 UTC to " + max(p.measured_at for r in results for p in r.probes),
        "versions": "liger-kernel 0.8.5, torch 2.13.0+cpu, lockfile sha256 12ab43339895",
        "inputs file": "inputs/frontier_smoke.yaml",
    }
    assert "Simulated out of memory." in summary and "CPU run." in summary
    assert (
        "Largest sequence length at per_device_train_batch_size=1: liger ≥ 64 (reached the cap), baseline 32 (length "
        "64 runs out of memory) (out of memory simulated by the fake memory model, not measured)."
    ) in summary
    assert (
        "With liger, sequence length 64 trains where the baseline runs out of memory (from length 64): at least ×2.00 "
        "the baseline's frontier (simulated by the fake memory model, not measured)."
    ) in report.headline
    assert "GPU seconds" not in html and "gpu_seconds" not in html
    # frontiers.csv: the probes' wall times as device seconds, whatever the device
    frontiers = frontier_table(searches, results)
    assert "gpu_seconds" not in frontiers and (frontiers["device_seconds"] == 3 * frontiers["probes_used"]).all()
    # frontiers.csv and probes.csv say what the probes trained on, as results.csv does
    assert set(frontiers["hardware"]) == {"cpu"} and set(probes_table(results)["hardware"]) == {"cpu"}
    probes_used = sum(r.probes_used for r in results)
    assert f"{probes_used} probes, {3 * probes_used} CPU seconds in all." in summary
    assert [line for line in report.headline if "out of memory:" in line] == [
        "simulated out of memory: baseline, max_seq_length 64 (out of memory at step 1: CUDA out of memory "
        "(fake memory model: 128 > 64 token units))"
    ] * sum(p.status == "oom" for p in results[1].probes)


def test_the_probes_figure_draws_an_out_of_memory_probe_on_the_line_its_caption_names():
    import matplotlib.pyplot as plt

    from finetune_bench.frontier.probes_figure import probes_figure

    searches, results, report = _simulated_report()
    assert "on the dotted out-of-memory line at the top of the panel" in report.sections["Probes"]
    probes = probes_table(results)
    figure = probes_figure(probes, None, cpu=True, simulated=True)
    (ax,) = figure.axes
    (line,) = [line for line in ax.lines if line.get_linestyle() == ":"]
    top = line.get_ydata()[0]
    points = [tuple(xy) for collection in ax.collections for xy in collection.get_offsets()]
    ooms = probes[probes["status"] == "oom"]
    assert len(ooms) and sorted(x for x, y in points if y == top) == sorted(ooms["value"])
    assert all(y < top for x, y in points if y != top)  # every ok probe at its measured peak, below the line
    assert "simulated" in figure._suptitle.get_text() and "a CPU run" in figure._suptitle.get_text()
    plt.close(figure)


@needs_chromium
def test_at_1400_px_no_table_of_the_frontier_report_scrolls_sideways(tmp_path):
    widths = table_widths(_simulated_report()[2].to_html(), tmp_path)
    assert {w["section"] for w in widths} == {"frontier", "probes"}
    assert [w for w in widths if w["scroll"] > w["client"]] == []


def test_a_probe_keeps_when_its_run_was_measured():
    from finetune_bench.frontier.probes import probe_outcome
    from finetune_bench.results.record import RunResult

    result = RunResult("c", 0, [], TrainingArgs(), "ok", details={"measured_at": "2026-11-27 09:00 UTC"})
    assert probe_outcome(result).measured_at == "2026-11-27 09:00 UTC"
