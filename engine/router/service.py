"""The router's state in the server: the core, the workers' client, the open exchanges, health.

All of it lives on the one event loop; the core is told the time from the
monotonic clock (seconds since the router started). The workers' client is an
aiohttp session with no limit on open connections (a request never waits for a
free one, and neither does a health check), opened by ``start`` on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

from core.router import Health, Router, RouterConfig
from engine.router.upstream import Exchange

log = logging.getLogger("engine.router")


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """``GET /health`` on every worker each ``interval_s``, and on a worker at once when one of
    its requests breaks off. A refused connection, or ``failures`` misses in a row (timeouts,
    errors), mark it dead (its open requests fail at once); a ``200`` makes it healthy again,
    a ``503`` that says ``draining`` makes it draining."""

    interval_s: float = 1.0
    timeout_s: float = 2.0
    failures: int = 2


class RouterService:
    """``role``: which workers these are behind a prefill/decode router (``prefill`` or
    ``decode``; empty for ``--worker``)."""

    def __init__(
        self, workers: list[str], config: RouterConfig, check: HealthCheck, role: str = ""
    ) -> None:
        self.core = Router(config, workers)
        self.role = role
        self.check = check
        self._session: aiohttp.ClientSession | None = None
        self.exchanges: dict[str, Exchange] = {}
        self.misses: Counter[str] = Counter()
        self.worker_failures: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.draining = False
        self._t0 = time.monotonic()
        self._next_rid = 0
        self._probes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the workers' client (on the running loop)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.check.timeout_s),
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "RouterService.start() opens the client"
        return self._session

    def now(self) -> float:
        return time.monotonic() - self._t0

    def new_rid(self) -> str:
        self._next_rid += 1
        return f"router-{self._next_rid}"

    def open(self, rid: str, worker: str) -> Exchange:
        exchange = Exchange(self.session, worker)
        self.exchanges[rid] = exchange
        return exchange

    def end(self, rid: str, finished: bool) -> None:
        self.exchanges.pop(rid, None)
        if finished:
            self.core.finished(rid, self.now())
        else:
            self.core.aborted(rid, self.now())

    def mark_dead(self, worker: str, reason: str) -> None:
        """Take ``worker`` out of rotation and fail its open requests with ``reason``."""
        if self.core.health(worker) is not Health.DEAD:
            log.warning("worker %s is down: %s", worker, reason)
            self.worker_failures[worker] += 1
        self.core.set_health(worker, Health.DEAD)
        for rid in self.core.open_requests(worker):
            exchange = self.exchanges.get(rid)
            if exchange is not None:
                exchange.fail(f"worker {worker} is down ({reason}); request {rid} failed")

    async def probe(self, worker: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self.check.timeout_s)
        try:
            async with self.session.get(f"{worker}/health", timeout=timeout) as response:
                status, text = response.status, await response.text()
        except aiohttp.ClientConnectorError:
            self.mark_dead(worker, "nothing listens at its address")
            return
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.missed(worker, f"health check failed: {type(exc).__name__}")
            return
        if status == 200:
            if self.core.health(worker) is not Health.HEALTHY:
                log.info("worker %s is healthy", worker)
            self.misses[worker] = 0
            self.core.set_health(worker, Health.HEALTHY)
        elif status == 503 and "draining" in text:
            self.misses[worker] = 0
            self.core.set_health(worker, Health.DRAINING)
        else:
            self.missed(worker, f"health check answered {status}")

    def missed(self, worker: str, reason: str) -> None:
        self.misses[worker] += 1
        if self.misses[worker] >= self.check.failures:
            self.mark_dead(worker, reason)

    def suspect(self, worker: str) -> None:
        """One of ``worker``'s requests broke off: check its health now."""
        task = asyncio.get_running_loop().create_task(self.probe(worker))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(w) for w in self.core.workers))

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check.interval_s)
            await self.probe_all()

    async def close(self) -> None:
        for rid, exchange in list(self.exchanges.items()):
            exchange.fail(f"the router is shutting down; request {rid} failed")
            await exchange.close()
        if self._session is not None:
            await self._session.close()
