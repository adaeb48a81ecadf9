"""``sim validate``: the real engine against the simulator on one trace, and its report."""
