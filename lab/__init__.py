"""Tools that measure and compare the two worlds: bench, profile, validate, sweep and capacity,
the report, and the `engine` and `sim` commands. The top layer: it imports everything below it."""
