"""The two console scripts: ``engine`` (serve, setup, profile, bench) and ``sim`` (replay, gen,
sweep, capacity, validate)."""
