"""``sim replay`` and ``sim gen``: their arguments, their runs and what they print."""
