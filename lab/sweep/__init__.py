"""``sim sweep`` and ``sim capacity``: many replays over a grid, or a search for the highest rate
that meets the SLOs."""
