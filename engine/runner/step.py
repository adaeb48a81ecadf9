"""A launched step: its sampled tokens on the device, and their way back to the host.

``StepHandle.tokens()`` waits for the copy of the step's tokens into pinned host
memory (a CUDA event), so a caller can launch step N+1 before it reads step N's
tokens. On CPU the step has already run when it is launched.
"""

from __future__ import annotations

import torch


def recorded_event() -> torch.cuda.Event:
    """A CUDA event recorded on the current stream now."""
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return event


class StepHandle:
    def __init__(self, sampled: torch.Tensor | None) -> None:
        """``sampled``: the step's tokens on the device (None for a step without model work)."""
        self.sampled = sampled
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        if sampled is not None and sampled.is_cuda:
            self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            self._host.copy_(sampled, non_blocking=True)
            self._event = recorded_event()

    def done(self) -> bool:
        """Whether ``tokens()`` would return without waiting."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def tokens(self) -> list[int]:
        """The sampled tokens, in the order of ``plan.sampling_rids()``."""
        if self.sampled is None:
            return []
        if self._event is not None and self._host is not None:
            self._event.synchronize()
            return [int(t) for t in self._host.tolist()]
        return [int(t) for t in self.sampled.tolist()]
