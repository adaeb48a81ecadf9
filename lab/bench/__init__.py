"""``engine bench``: replay a trace against an OpenAI-compatible server at its arrival times."""
