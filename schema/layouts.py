"""The engine's process layouts: where tokenization and detokenization run.

- ``split``: tokenizer worker processes and a detokenizer process of their own, ZeroMQ
  messages between them, the frontend and the scheduler ranks;
- ``frontend``: both on threads of the frontend's process;
- ``inline``: both in scheduler rank 0's loop, between steps.

``engine serve --layout`` runs one; ``sim replay --layout`` models it from the same profile.
"""

from __future__ import annotations

LAYOUTS = ("split", "frontend", "inline")
