"""``sim trace``: cut a shorter trace out of a trace file (the cutting itself is
``schema.traces.window`` and ``schema.traces.conversations``)."""
