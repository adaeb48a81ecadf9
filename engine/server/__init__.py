"""The HTTP frontend: OpenAI-compatible and native routes, SSE, metrics."""
