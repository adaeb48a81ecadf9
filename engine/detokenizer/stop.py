"""Stop strings on streamed text: emit up to the first match, hold back possible starts."""

from __future__ import annotations


class StopMatcher:
    """Feeds on text deltas; returns the text safe to emit and whether a stop matched.

    The stop that matches is the one whose occurrence *ends* first in the text
    (the first moment a stop is complete), the earliest-starting on a tie; so
    the result does not depend on how the text was split into deltas.
    Invariant: text is held back exactly while a suffix of it could still grow
    into a stop string, so a stop string never straddles emitted text and the
    output never contains a stop string.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.matched is not None:
            return "", True
        self.pending += delta
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(i + len(s), i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            _, index, self.matched = min(hits)
            out, self.pending = self.pending[:index], ""
            return out, True
        keep = self._held_suffix()
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def _held_suffix(self) -> int:
        """Length of the longest suffix of ``pending`` that is a proper prefix of a stop."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """The held-back text, at the end of a request that hit no stop string."""
        out, self.pending = self.pending, ""
        return "" if self.matched is not None else out
