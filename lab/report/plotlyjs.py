"""How a report page loads plotly.js: inlined, one shared file, or from the CDN.

Plotly's own ``include_plotlyjs`` (``True`` / ``"directory"`` / ``"cdn"``) names the
same three choices:

- ``inline`` (the default): plotly.js (~4.8 MB) inside the page; the page is
  self-contained and opens offline, on its own, anywhere.
- ``directory``: one ``plotly.min.js`` in a folder (the page's own folder unless told),
  written once and loaded by a relative path by every page that points to it; a run
  that writes many pages (``sim validate``: each real run, the simulation and the
  comparison) carries one copy for its whole output tree, and opens offline as long
  as the tree stays together.
- ``cdn``: a ``<script src>`` to the plotly.js of the installed plotly version on
  cdn.plot.ly; the page is small but needs the network to draw its figures.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from plotly.offline import get_plotlyjs, get_plotlyjs_version

PLOTLYJS_MODES = ("inline", "directory", "cdn")
PLOTLY_FILE = "plotly.min.js"
CDN = "https://cdn.plot.ly"
PLOTLYJS_HELP = (
    "how report pages load plotly.js: inline (~4.8 MB in each page, self-contained, "
    f"opens offline), directory (one {PLOTLY_FILE} beside the pages of the output folder, "
    "shared by them) or cdn (a link to cdn.plot.ly; small pages that need the network)"
)


@dataclass(frozen=True, slots=True)
class PlotlyJs:
    """Where a page finds plotly.js; ``folder`` holds the shared copy in ``directory`` mode
    (default: the page's own folder)."""

    mode: str = "inline"
    folder: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in PLOTLYJS_MODES:
            raise ValueError(f"plotly.js mode {self.mode!r}: one of {', '.join(PLOTLYJS_MODES)}")

    def script(self, page: Path) -> str:
        """The ``<script>`` tag of the page written at ``page``; in ``directory`` mode,
        writes the shared ``plotly.min.js`` first unless the folder already holds it."""
        if self.mode == "inline":
            return f"<script type='text/javascript'>{get_plotlyjs()}</script>"
        if self.mode == "cdn":
            src = f"{CDN}/plotly-{get_plotlyjs_version()}.min.js"
            return f"<script src='{src}' charset='utf-8'></script>"
        folder = Path(self.folder or page.parent)
        shared = folder / PLOTLY_FILE
        if not shared.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            shared.write_text(get_plotlyjs(), encoding="utf-8")
        src = Path(os.path.relpath(shared, page.parent)).as_posix()
        return f"<script src='{src}' charset='utf-8'></script>"


INLINE = PlotlyJs()


def add_plotlyjs_argument(parser: argparse.ArgumentParser, default: str = "inline") -> None:
    """``--plotlyjs {inline,directory,cdn}``: read it back with ``PlotlyJs(args.plotlyjs)``
    (``PlotlyJs(args.plotlyjs, args.out)`` shares one copy over an output tree)."""
    help_text = f"{PLOTLYJS_HELP}; default {default}"
    parser.add_argument("--plotlyjs", choices=PLOTLYJS_MODES, default=default, help=help_text)
