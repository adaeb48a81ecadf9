"""``engine profile``: time the serving runner over a grid of batch plans, and the CPU stages."""
