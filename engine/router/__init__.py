"""``engine router``: the router core in front of OpenAI-compatible servers, over HTTP."""
