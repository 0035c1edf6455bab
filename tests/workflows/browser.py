"""Open an HTML page in headless Chromium (Debian's `chromium`): what every image decoded to, script errors,
the "What was measured" header as laid out, and a screenshot."""

import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--mute-audio"]

# Runs first in <head>: records script errors, then on load draws every image onto a canvas and reports its
# natural size, shown size, number of distinct colours and share of non-white pixels (sampled).
_CHECKER = """<script>
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message || e)));
window.addEventListener("unhandledrejection", (e) => window.__errors.push("unhandled rejection: " + e.reason));
window.addEventListener("load", () => {
  const out = {errors: window.__errors, images: []};
  for (const img of document.images) {
    const r = {alt: img.alt, complete: img.complete, natural_width: img.naturalWidth,
               natural_height: img.naturalHeight, shown_width: img.getBoundingClientRect().width,
               distinct_colours: 0, ink_fraction: 0};
    try {
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
      const context = canvas.getContext("2d");
      context.drawImage(img, 0, 0);
      const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
      const colours = new Set(); let ink = 0, samples = 0;
      for (let i = 0; i < data.length; i += 4 * 5) {
        colours.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
        if (data[i] + data[i + 1] + data[i + 2] < 720) ink++;
        samples++;
      }
      r.distinct_colours = colours.size; r.ink_fraction = samples ? ink / samples : 0;
    } catch (e) { r.error = String(e); }
    out.images.push(r);
  }
  const header = document.querySelector(".measured");
  out.header = header ? {text: header.innerText, top: header.getBoundingClientRect().top,
                         height: header.getBoundingClientRect().height} : null;
  const pre = document.createElement("pre");
  pre.id = "browser-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _run(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        raise RuntimeError("headless Chromium is not installed (Debian: apt-get install chromium)")
    return subprocess.run([CHROMIUM, *_FLAGS, *args], capture_output=True, text=True, timeout=timeout_s)


def inspect_page(page: Path, work_dir: Path) -> dict:
    """Load a copy of `page` with the checker injected; return {"errors": [...], "images": [...], "header": {...}}
    (the header: the "What was measured" block's text and where it is laid out, None when the page has none)."""
    text = page.read_text()
    checked = work_dir / f"checked-{page.name}"
    checked.write_text(re.sub(r"<head[^>]*>", lambda m: m.group(0) + _CHECKER, text, count=1))
    completed = _run(["--virtual-time-budget=20000", "--dump-dom", checked.as_uri()])
    found = re.search(r'<pre id="browser-check">(.*?)</pre>', completed.stdout, re.DOTALL)
    if not found:
        raise AssertionError(f"the page never finished loading in Chromium:\n{completed.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 9000) -> Path:
    """A screenshot of the top `height` pixels of `page` at `width`."""
    completed = _run([f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri()])
    if not out.exists():
        raise AssertionError(f"Chromium took no screenshot:\n{completed.stderr[-2000:]}")
    return out
