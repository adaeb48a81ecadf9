"""Does an HTML report fit a laptop's window? Measured in a real headless Chromium.

``python -m lab.report.fits PAGE.html [PAGE.html ...] [--width 1400]`` opens each
page at that window width, lets Plotly draw, and reads back:

- the page's width (``document.documentElement.scrollWidth``) against the window's;
- every element that reaches past the window's right edge without a scrolling box
  around it: the outermost box that is too wide (a wide table, not each of its cells),
  or the innermost element whose own content runs past it (a long line in a ``<pre>``);
- Plotly's toolbar (the modebar) against the figure's titles, legend and annotations
  it would cover.

Exit status 0 when every page fits, 1 when one does not (the offending elements are
printed), 2 when no Chromium is found. ``--screenshot DIR`` also writes a full-page PNG
of each page. The probe is a copy of the page with a short script appended, run with
``chromium --headless --dump-dom``; the page itself is not changed.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
"""Binaries tried on ``PATH``, in order, unless ``$CHROMIUM`` names one."""
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio",
)  # fmt: skip
RESULT_ID = "report-fits-result"
MAX_SCREENSHOT_HEIGHT = 16_000
"""A full-page screenshot is cut at this height (px)."""

PROBE = """
<script>
window.addEventListener("load", function () { setTimeout(function () {
  var W = document.documentElement.clientWidth;
  function name(el) {
    var s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    var c = el.getAttribute("class");
    if (c) s += "." + c.trim().split(/\\s+/).slice(0, 3).join(".");
    var t = (el.textContent || "").replace(/\\s+/g, " ").trim();
    return t ? s + " \\"" + t.slice(0, 60) + "\\"" : s;
  }
  function scrolls(el) {
    for (var a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") return true;
    }
    return false;
  }
  function boxOver(el) {
    var r = el.getBoundingClientRect();
    return r.width > 0 && r.right > W + 0.5 && !scrolls(el);
  }
  function over(el) {
    var r = el.getBoundingClientRect();
    var spills = getComputedStyle(el).overflowX === "visible";
    var right = spills ? Math.max(r.right, r.left + el.scrollWidth) : r.right;
    return r.width > 0 && right > W + 0.5 && !scrolls(el);
  }
  function own(el) {
    for (var c = el.firstElementChild; c; c = c.nextElementSibling) if (over(c)) return false;
    return true;
  }
  function wide(el) {
    if (boxOver(el)) return !(el.parentElement && boxOver(el.parentElement));
    return over(el) && own(el);
  }
  function meet(a, b) {
    return a.width > 0 && b.width > 0 && a.left < b.right && b.left < a.right &&
      a.top < b.bottom && b.top < a.bottom;
  }
  var out = {window: W, page: document.documentElement.scrollWidth, wide: [], boxes: [],
             covered: [], figures: document.querySelectorAll(".js-plotly-plot").length};
  var all = document.body.getElementsByTagName("*");
  for (var i = 0; i < all.length; i++) {
    var el = all[i];
    if (wide(el)) {
      var r = el.getBoundingClientRect();
      var right = boxOver(el) ? r.right : r.left + el.scrollWidth;
      out.wide.push({element: name(el), left: Math.round(r.left), right: Math.round(right)});
    }
    var o = getComputedStyle(el).overflowX;
    if ((o === "auto" || o === "scroll") && el.scrollWidth > el.clientWidth + 1) {
      out.boxes.push({element: name(el), width: el.clientWidth, content: el.scrollWidth});
    }
  }
  document.querySelectorAll(".js-plotly-plot").forEach(function (plot) {
    var bar = plot.querySelector(".modebar");
    if (!bar) return;
    var b = bar.getBoundingClientRect();
    plot.querySelectorAll(".gtitle, .annotation-text, .legend, .g-xtitle, .g-ytitle")
      .forEach(function (t) {
        if (meet(b, t.getBoundingClientRect())) out.covered.push({element: name(t)});
      });
  });
  out.height = document.documentElement.scrollHeight;
  var pre = document.createElement("pre");
  pre.id = "RESULT_ID";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500); });
</script>
""".replace("RESULT_ID", RESULT_ID)


@dataclass(slots=True)
class Fit:
    """What the browser measured on one page at one window width."""

    page: Path
    window: int
    page_width: int
    height: int
    figures: int
    wide: list[dict[str, Any]] = field(default_factory=list)
    boxes: list[dict[str, Any]] = field(default_factory=list)
    covered: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.page_width <= self.window and not self.wide and not self.covered

    def lines(self) -> list[str]:
        state = "fits" if self.fits else "DOES NOT FIT"
        out = [
            f"{self.page}: {state}: page {self.page_width} px in a {self.window} px window, "
            f"{self.figures} figure(s)"
        ]
        out += [f"  wider than the window: {w['element']} (right edge {w['right']} px)"
                for w in self.wide]  # fmt: skip
        out += [f"  toolbar covers: {c['element']}" for c in self.covered]
        out += [f"  scrolls in its own box: {b['element']} ({b['content']} px in {b['width']} px)"
                for b in self.boxes]  # fmt: skip
        return out


def find_chromium() -> str | None:
    """``$CHROMIUM``, else the first of ``CHROMIUM_NAMES`` on ``PATH``."""
    given = os.environ.get("CHROMIUM")
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _chromium(binary: str, profile: Path, width: int, height: int, *args: str) -> str:
    command = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               f"--window-size={width},{height}", *args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def _probe_copy(page: Path, folder: Path) -> Path:
    """The page with the probe appended and a ``<base>`` so relative links (a shared
    plotly.min.js) resolve beside the original."""
    text = page.read_text(encoding="utf-8")
    base = f"<base href='{page.resolve().parent.as_uri()}/'>"
    text = re.sub(r"<head>", "<head>" + base, text, count=1, flags=re.IGNORECASE)
    probe = folder / "probe.html"
    probe.write_text(text + PROBE, encoding="utf-8")
    return probe


def measure(page: Path, width: int = 1400, height: int = 900, chromium: str | None = None,
            screenshot: Path | None = None) -> Fit:  # fmt: skip
    """Open ``page`` in headless Chromium at ``width`` x ``height`` and measure it;
    with ``screenshot``, also write a full-page PNG there."""
    binary = chromium or find_chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium found (install chromium or set $CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="report-fits-") as tmp:
        folder = Path(tmp)
        probe = _probe_copy(page, folder)
        dom = _chromium(binary, folder / "profile", width, height,
                        "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())  # fmt: skip
        found = re.search(rf'<pre id="{RESULT_ID}">(.*?)</pre>', dom, flags=re.DOTALL)
        if found is None:
            raise RuntimeError(f"{page}: the probe did not run (the page never loaded?)")
        got = json.loads(html.unescape(found.group(1)))
        if screenshot is not None:
            tall = min(max(height, int(got["height"])), MAX_SCREENSHOT_HEIGHT)
            _chromium(binary, folder / "profile2", width, tall, "--virtual-time-budget=10000",
                      f"--screenshot={screenshot.resolve()}", page.resolve().as_uri())  # fmt: skip
    return Fit(page, int(got["window"]), int(got["page"]), int(got["height"]),
               int(got["figures"]), got["wide"], got["boxes"], got["covered"])  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab.report.fits",
        description="Check that HTML reports fit a browser window: opens each page in headless "
        "Chromium and fails (exit 1) when the page, or an element outside a scrolling box, is "
        "wider than the window, or when Plotly's toolbar covers a title.",
    )
    p.add_argument("pages", nargs="+", type=Path, help="HTML files to check")
    p.add_argument("--width", type=int, default=1400, help="window width in px (default 1400)")
    p.add_argument("--height", type=int, default=900, help="window height in px (default 900)")
    p.add_argument("--screenshot", type=Path, metavar="DIR",
                   help="also write a full-page PNG of each page into DIR")  # fmt: skip
    p.add_argument("--chromium", help="the browser binary (default: $CHROMIUM, else on PATH)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    binary = args.chromium or find_chromium()
    if binary is None:
        print("no Chromium found: install chromium or set $CHROMIUM", file=sys.stderr)
        return 2
    if args.screenshot:
        args.screenshot.mkdir(parents=True, exist_ok=True)
    ok = True
    for page in args.pages:
        shot = None
        if args.screenshot:
            stem = "_".join(page.resolve().with_suffix("").parts[-2:])
            shot = args.screenshot / f"{stem}_{args.width}.png"
        fit = measure(page, args.width, args.height, binary, shot)
        ok &= fit.fits
        print("\n".join(fit.lines()) + (f"\n  screenshot: {shot}" if shot else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
