"""The frontier report's Frontiers and Probes tables on a GPU, with the long reasons a real out-of-memory error gives:
how each search or probe ended and what it found first, why last, the memory figures no row measured and what the
search cost behind the toggle, and long names that may break, so that a page 1400 px wide shows every column,
`reason` included, without scrolling sideways."""

import re

from finetune_bench.frontier.report import breakable_cells, build_frontier_report
from finetune_bench.frontier.search import search_frontier
from finetune_bench.frontier.settings import BATCH_SIZE, SEQ_LENGTH
from tests.frontier.test_frontier import FakeProbe, make_search
from tests.reporting.test_wide_tables import needs_chromium, table_widths

# What PyTorch says when a GPU runs out of memory: long, and with words that have no space to break at.
CUDA_OOM = (
    "out of memory at step 1 (backward): CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity "
    "of 139.81 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 138.60 GiB memory in use. "
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
    "avoid fragmentation."
)


class CudaOomProbe(FakeProbe):
    """FakeProbe (a Fake GPU of 300 GiB) whose out-of-memory probes say what PyTorch says."""

    def __call__(self, args):
        outcome = super().__call__(args)
        if outcome.status == "oom":
            outcome.reason = CUDA_OOM
        return outcome


def gpu_frontier_report():
    """Liger and the baseline along both dimensions on a GPU; the baseline's batch search stops on a probe that keeps
    failing."""
    searches = [
        make_search(BATCH_SIZE, start=1, cap=256, liger=True),
        make_search(BATCH_SIZE, start=1, cap=256),
        make_search(SEQ_LENGTH, start=512, cap=65536, granularity=256, liger=True),
        make_search(SEQ_LENGTH, start=512, cap=65536, granularity=256),
    ]
    probes = [
        CudaOomProbe(40, BATCH_SIZE),
        CudaOomProbe(24, BATCH_SIZE, failures={32: ["error"] * 3}),
        CudaOomProbe(20000, SEQ_LENGTH),
        CudaOomProbe(9000, SEQ_LENGTH),
    ]
    results = [search_frontier(search, probe) for search, probe in zip(searches, probes, strict=True)]
    return build_frontier_report(searches, results)


def _headers(fragment: str) -> list[str]:
    return [h.replace("<wbr>", "") for h in re.findall(r"<th>(.*?)</th>", fragment.split("</table>", 1)[0])]


def test_the_frontiers_table_opens_with_its_verdict_and_keeps_the_rest_behind_a_toggle():
    report = gpu_frontier_report()
    after = report.sections["Frontier"].split("<h3>Frontiers</h3>", 1)[1]
    shown = _headers(after)
    assert shown[:5] == ["arm", "dimension", "status", "frontier", "first_oom"] and shown[-1] == "reason"
    assert "peak_reserved_gib" in shown and "peak_reserved_share_of_gpu" in shown
    # no row measured host memory (a GPU's probes); what the search cost is summed below the table
    assert "process_peak_rss_gib" not in shown and "probes_used" not in shown and "device_seconds" not in shown
    assert re.search(r'<details class="columns"><summary>the frontiers: all \d+ columns', after)
    probes = _headers(report.sections["Probes"].split("</p>", 1)[1])
    assert probes[:4] == ["arm", "dimension", "value", "status"] and probes[-1] == "reason"
    assert "the probes: all " in report.sections["Probes"]


def test_a_long_word_in_a_cell_may_break_where_it_has_an_underscore_an_equals_sign_or_a_colon():
    cell = "<td>per_device_train_batch_size=40 trains; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</td>"
    assert breakable_cells(cell) == (
        "<td>per_<wbr>device_<wbr>train_<wbr>batch_<wbr>size=<wbr>40 trains; set PYTORCH_<wbr>CUDA_<wbr>ALLOC_<wbr>"
        "CONF=<wbr>expandable_<wbr>segments:<wbr>True</td>"
    )
    assert breakable_cells("<td>max_seq_length</td><th>a_long_header_name_here</th>") == (
        "<td>max_seq_length</td><th>a_long_header_name_here</th>"  # short words, and headers, are left alone
    )


@needs_chromium
def test_at_1400_px_no_table_of_a_gpu_frontier_report_scrolls_sideways(tmp_path):
    widths = table_widths(gpu_frontier_report().to_html(), tmp_path)
    assert {w["section"] for w in widths} == {"frontier", "probes"}
    assert [w for w in widths if w["scroll"] > w["client"]] == []
