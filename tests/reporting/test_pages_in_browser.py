"""Each report as a reader's browser lays it out, 1400 px wide (headless Chromium): the benchmark report of the GPU
example's stored runs (docs/examples/), a frontier report on a GPU with PyTorch's long out-of-memory reasons, and a
kernel report. No table or image is wider than the page, unless it sits in a `.table` box that scrolls sideways and
is itself within the page; no table a reader sees without opening a toggle needs that box to scroll sideways (none
hides a column behind its scroll bar); the page itself does not scroll sideways; the headline card's figures overlap
neither each other nor the edge of their card, and no card overlaps another."""

import html
import importlib.util
import json
import os
import re
import shutil
from itertools import combinations
from pathlib import Path

import pytest

from finetune_bench.kernels.report import build_kernel_report
from finetune_bench.prediction.fine_tune import FineTune
from tests.kernels.test_kernels import _gpu_rows
from tests.reporting.test_frontier_tables import gpu_frontier_report
from tests.workflows import browser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "variable-length-llama1b-h200"
WIDTH = 1400

pytestmark = pytest.mark.skipif(
    browser.CHROMIUM is None, reason="needs headless Chromium (Debian: apt-get install chromium)"
)

# Runs once the page has loaded (its images decoded): the viewport's width and the page's, every table and image a
# reader sees (not behind a closed toggle) that reaches past the viewport outside a `.table` box scrolling sideways
# within it, every such box a reader sees that scrolls sideways (its table wider than the box: the columns past the
# box's right edge are hidden until the reader scrolls), and each headline card's box with its figures' boxes and
# their parts' (the number and its label). A closed toggle's content still has a size as Chromium measures it: it is
# told by the closed <details> around it.
_LAYOUT = """<script>
window.addEventListener("load", () => {
  const viewport = document.documentElement.clientWidth;
  const box = (el) => { const r = el.getBoundingClientRect();
                        return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const within = (r) => r.left >= -0.5 && r.right <= viewport + 0.5;
  const hidden = (el) => el.closest("details:not([open])") !== null;
  const out = {viewport: viewport, page: document.documentElement.scrollWidth, tables: 0, images: 0, wide: [],
               scrolling: [], cards: []};
  for (const el of document.querySelectorAll("div.table")) {
    if (hidden(el) || el.scrollWidth <= el.clientWidth) continue;
    const edge = el.getBoundingClientRect().right;
    const section = el.closest("section");
    let heading = el.previousElementSibling;
    while (heading && !/^H[1-6]$/.test(heading.tagName)) heading = heading.previousElementSibling;
    out.scrolling.push({section: section ? section.id : "", heading: heading ? heading.textContent : "",
                        scroll: el.scrollWidth, client: el.clientWidth,
                        cut_off: [...el.querySelectorAll("thead th")]
                          .filter((th) => th.getBoundingClientRect().right > edge + 0.5)
                          .map((th) => th.textContent)});
  }
  for (const el of document.querySelectorAll("table, img")) {
    const r = el.getBoundingClientRect();
    if (hidden(el) || (r.width === 0 && r.height === 0)) continue;  // behind a closed toggle
    el.tagName === "IMG" ? out.images++ : out.tables++;
    if (within(r)) continue;
    const wrapper = el.closest("div.table");
    if (wrapper && ["auto", "scroll"].includes(getComputedStyle(wrapper).overflowX) && within(box(wrapper))) continue;
    const section = el.closest("section");
    out.wide.push({element: el.tagName.toLowerCase() + (el.alt ? ` "${el.alt}"` : ""),
                   section: section ? section.id : "", left: r.left, right: r.right});
  }
  for (const card of document.querySelectorAll(".card")) {
    out.cards.push({box: box(card), title: (card.querySelector(".card-title") || {}).textContent || "",
                    figures: [...card.querySelectorAll(".figure")].map((figure) => ({
                      text: figure.innerText, box: box(figure), parts: [...figure.children].map(box)}))});
  }
  const pre = document.createElement("pre"); pre.id = "layout"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def layout(page: str, path: Path) -> dict:
    """`page` (a report's HTML) laid out by headless Chromium WIDTH px wide: what `_LAYOUT` measures."""
    path.write_text(page.replace("<head>", "<head>" + _LAYOUT, 1))
    completed = browser._run(
        [f"--window-size={WIDTH},2000", "--virtual-time-budget=10000", "--dump-dom", path.as_uri()]
    )
    found = re.findall(r'<pre id="layout">(.*?)</pre>', completed.stdout, re.DOTALL)
    assert found, f"the page never finished loading in Chromium:\n{completed.stderr[-2000:]}"
    shots = os.environ.get("FINETUNE_BENCH_SCREENSHOT_DIR")
    if shots:  # the page as laid out, for a reader to look at
        Path(shots).mkdir(parents=True, exist_ok=True)
        browser.screenshot(path, Path(shots) / f"{path.stem}.png", width=WIDTH)
    return json.loads(html.unescape(found[0]))


def _overlap(a: dict, b: dict) -> bool:
    """Whether two boxes share more than half a pixel each way."""
    return min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5 and (
        min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
    )


def _inside(inner: dict, outer: dict) -> bool:
    return all(
        (inner[side] >= outer[side] - 0.5) if side in ("left", "top") else (inner[side] <= outer[side] + 0.5)
        for side in ("left", "right", "top", "bottom")
    )


def card_collisions(cards: list[dict]) -> list[str]:
    """Every figure of a card that overlaps another, a figure or a part of one past its card's edge, and every two
    cards that overlap."""
    found = []
    for card in cards:
        figures = card["figures"]
        for a, b in combinations(figures, 2):
            if _overlap(a["box"], b["box"]):
                found.append(f"{card['title']}: {a['text']!r} overlaps {b['text']!r}")
        for figure in figures:
            if not all(_inside(part, card["box"]) for part in [figure["box"], *figure["parts"]]):
                found.append(f"{card['title']}: {figure['text']!r} reaches past its card")
    for a, b in combinations(cards, 2):
        if _overlap(a["box"], b["box"]):
            found.append(f"the cards {a['title']!r} and {b['title']!r} overlap")
    return found


def _benchmark_page(tmp_path: Path) -> str:
    """The GPU example report, rendered from its stored runs by `scripts/example_report.py`'s `render`."""
    spec = importlib.util.spec_from_file_location("example_report", ROOT / "scripts" / "example_report.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    directory = tmp_path / "example"
    shutil.copytree(EXAMPLE / "runs", directory / "runs")
    example.render(directory, FineTune(epochs=1), "Fine-tuning benchmark")
    return (directory / "report.html").read_text()


def _frontier_page(tmp_path: Path) -> str:
    return gpu_frontier_report().to_html(title="Memory frontier")


def _kernel_page(tmp_path: Path) -> str:
    rows = _gpu_rows().assign(extra_benchmark_config_str='{"model": "llama-3-8b", "hidden_size": 4096}')
    return build_kernel_report(rows, "llama-3-8b").to_html(title="Liger kernels")


@pytest.mark.parametrize(
    ("build", "cards", "figures"),
    [(_benchmark_page, 1, 4), (_frontier_page, 2, 1), (_kernel_page, 2, 3)],
    ids=["benchmark", "frontier", "kernels"],
)
def test_at_1400_px_nothing_is_wider_than_the_page_and_no_headline_figure_overlaps_another(
    tmp_path, build, cards, figures
):
    measured = layout(build(tmp_path), tmp_path / f"{build.__name__.strip('_')}.html")
    assert measured["viewport"] >= WIDTH - 20  # laid out at the width asked for (less a scroll bar, if any)
    assert measured["tables"] > 0 and measured["images"] > 0
    assert measured["wide"] == []
    assert measured["scrolling"] == []  # no table a reader sees hides a column behind a scroll bar
    assert measured["page"] <= measured["viewport"]  # nothing else pushes the page sideways either
    assert len(measured["cards"]) == cards
    assert all(len(card["figures"]) >= figures for card in measured["cards"])
    assert card_collisions(measured["cards"]) == []


def test_two_figures_that_share_a_line_overlap_and_one_past_its_card_is_named():
    box = {"left": 0, "right": 100, "top": 0, "bottom": 50}
    shifted = {"left": 90, "right": 190, "top": 10, "bottom": 40}
    below = {"left": 0, "right": 100, "top": 50, "bottom": 90}
    card = {"title": "liger vs baseline", "box": {"left": 0, "right": 180, "top": 0, "bottom": 100}}
    figures = [{"text": "×1.2", "box": box, "parts": []}, {"text": "×0.5", "box": shifted, "parts": []}]
    assert card_collisions([{**card, "figures": figures}]) == [
        "liger vs baseline: '×1.2' overlaps '×0.5'",
        "liger vs baseline: '×0.5' reaches past its card",
    ]
    assert card_collisions([{**card, "figures": [figures[0], {"text": "3 of 3", "box": below, "parts": []}]}]) == []
