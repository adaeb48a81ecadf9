"""The simulator's Plotly bottleneck report: where the time goes and what limits a run.

``write_report(out_dir, summary, requests, steps, queues, itl)`` writes
``out_dir/report.html`` (self-contained by default; ``lab.report.plotlyjs`` for a
shared plotly.min.js or the CDN) and returns the verdict;
``bottleneck_verdict(summary, requests, steps, queues)`` is the pure verdict
(rules in ``lab.report.verdict``). ``python -m lab.report.fits PAGE.html`` checks in
headless Chromium that a page fits the window.
"""

from __future__ import annotations

from lab.report.verdict import bottleneck_verdict
from lab.report.write import write_report

__all__ = ["bottleneck_verdict", "write_report"]
