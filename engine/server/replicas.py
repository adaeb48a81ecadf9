"""The frontend's view of its data-parallel replicas: the router core that places each request,
fed back with every request's end, and the replicas that left the rotation.

The core is told the time from the monotonic clock (seconds since the
frontend started). A request is open on its replica from ``place`` until
``ended`` (finished, failed, aborted or timed out); a replica that fails
(``fail``) gets nothing more, and its open requests are handed back to be failed.
"""

from __future__ import annotations

import time

from core.router import Health, NoWorkerAvailable, Router, RouterConfig
from core.router.prompt_key import chat_text, route_request
from engine.ipc import messages
from engine.server.errors import APIError

NO_REPLICA_RETRY_AFTER_S = 5


def prompt_text(req: messages.GenerateRequest) -> str:
    """The text the router keys ``req`` by (a chat's as ``chat_text`` writes it)."""
    if req.messages is not None:
        return chat_text((m.role, m.content) for m in req.messages)
    return req.text or ""


class Replicas:
    def __init__(self, config: RouterConfig, dp_size: int) -> None:
        self.core = Router(config, [str(r) for r in range(dp_size)])
        self.down: dict[int, str] = {}  # replica -> why it left the rotation
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def place(self, req: messages.GenerateRequest) -> int:
        """The replica for ``req`` (now open on it); 503 when no replica is left."""
        try:
            route = route_request(
                req.rid, prompt_text(req), req.input_ids, req.sampling.max_new_tokens, req.session
            )
            return int(self.core.route(route, self.now()))
        except NoWorkerAvailable:
            raise APIError(
                "no replica is serving: " + "; ".join(self.down.values()),
                status=503,
                code="no_replica",
                retry_after=NO_REPLICA_RETRY_AFTER_S,
            ) from None

    def replica_of(self, rid: str) -> int | None:
        """The live replica ``rid`` is open on, if any."""
        worker = self.core.worker_of(rid)
        return None if worker is None else int(worker)

    def ended(self, rid: str, finished: bool) -> None:
        if finished:
            self.core.finished(rid, self.now())
        else:
            self.core.aborted(rid, self.now())

    def fail(self, replica: int, reason: str) -> list[str]:
        """Take ``replica`` out of the rotation; the rids that were open on it (now ended)."""
        self.down[replica] = reason
        self.core.set_health(str(replica), Health.DEAD)
        rids = self.core.open_requests(str(replica))
        for rid in rids:
            self.ended(rid, finished=False)
        return rids

    def states(self) -> dict[str, str]:
        """Each replica's state: ``healthy`` or ``dead``."""
        return {w: self.core.health(w).value for w in self.core.workers}
