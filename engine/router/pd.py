"""``engine router --prefill URL ... --decode URL ...``: each request to a prefill server and
a decode server at once, as SGLang's router does.

Per request the router core picks a prefill worker (among the ``--prefill`` servers) and a
decode worker (among the ``--decode`` ones), each set with its own books and health, and
sends both the client's body with the same ``pd.room``; the prefill server's body also
names the decode server's hand-off address (from its model card) and asks for no stream::

    client ─► router ─┬─► prefill server: {..., "stream": false,
                      │                    "pd": {"room": R, "decode": HANDOFF_ADDRESS}}
                      │      prefills, hands R off to the decode server, pushes the KV,
                      │      answers with its first token (finish reason "handoff")
                      └─► decode server: {..., "pd": {"room": R}}
                             waits for R's hand-off, streams every token ─► client

The decode server's answer goes to the client as the ``--worker`` router passes a worker's
on; the prefill server's is read and dropped, unless it fails: its error then ends the
client's request (the decode server's error body as it is, or mid-stream an SSE ``error``
event). A decode failure or a client that goes away closes both exchanges, which aborts the
request on both servers (and so releases the prefill server's pages at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from core.router import NoWorkerAvailable
from engine.router.app import collect, error, failure_response, read_payload, stream
from engine.router.keys import body_route
from engine.router.service import RouterService
from engine.router.upstream import END, Exchange, Failure, Head

log = logging.getLogger("engine.router")
CARD_TIMEOUT = aiohttp.ClientTimeout(total=10)
PREFILL_GRACE_S = 2.0  # after the decode server answered, how long the prefill's answer may take


class WrongWorker(Exception):
    """A worker is not the server its flag says (its role), or its card cannot be read."""


class PDCluster:
    """The prefill and decode workers' services, and what the router learned of the decode
    servers (their hand-off addresses, from their cards)."""

    def __init__(self, prefill: RouterService, decode: RouterService) -> None:
        self.prefill = prefill
        self.decode = decode
        self.handoff: dict[str, str] = {}  # decode worker -> its hand-off address
        self.prefill_checked: set[str] = set()
        self.pending: set[asyncio.Task[None]] = set()  # prefill answers still coming

    @property
    def services(self) -> list[RouterService]:
        return [self.prefill, self.decode]

    async def card(self, service: RouterService, worker: str, role: str) -> dict[str, object]:
        """``worker``'s model card; ``WrongWorker`` unless it serves with ``role``."""
        try:
            async with service.session.get(f"{worker}/v1/models", timeout=CARD_TIMEOUT) as r:
                card = (await r.json())["data"][0]
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
            raise WrongWorker(f"cannot read the model card of {worker}: {exc}") from None
        if card.get("role") != role:
            raise WrongWorker(
                f"{worker} is not a {role} server (its role: {card.get('role', 'colocated')}); "
                f"start it with engine serve --role {role}"
            )
        return dict(card)

    async def handoff_address(self, worker: str) -> str:
        """The decode server ``worker``'s hand-off address (read once from its card)."""
        if worker not in self.handoff:
            card = await self.card(self.decode, worker, "decode")
            self.handoff[worker] = str(card["handoff_address"])
        return self.handoff[worker]

    async def check_prefill(self, worker: str) -> None:
        if worker not in self.prefill_checked:
            await self.card(self.prefill, worker, "prefill")
            self.prefill_checked.add(worker)

    async def close(self) -> None:
        for task in list(self.pending):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def forward_pd(pd: PDCluster, request: web.Request) -> web.StreamResponse:
    """Answer a generation request with a prefill server and a decode server."""
    payload = await read_payload(pd.decode, request)
    if isinstance(payload, web.Response):
        return payload
    route = body_route(pd.decode.new_rid(), payload)
    rid = route.rid
    try:
        prefill_worker = pd.prefill.core.route(route, pd.prefill.now())
    except NoWorkerAvailable:
        pd.decode.rejected["no_worker"] += 1
        return error("no healthy prefill worker to serve this request", 503, "no_worker")
    try:
        decode_worker = pd.decode.core.route(route, pd.decode.now())
    except NoWorkerAvailable:
        pd.prefill.end(rid, finished=False)
        pd.decode.rejected["no_worker"] += 1
        return error("no healthy decode worker to serve this request", 503, "no_worker")
    try:
        await pd.check_prefill(prefill_worker)
        handoff = await pd.handoff_address(decode_worker)
    except WrongWorker as exc:
        pd.prefill.end(rid, finished=False)
        pd.decode.end(rid, finished=False)
        return error(str(exc), 503, "wrong_worker")
    room = uuid.uuid4().hex
    bodies = pd_bodies(payload, room, handoff)
    prefill = pd.prefill.open(rid, prefill_worker)
    decode = pd.decode.open(rid, decode_worker)
    prefill.start(request.path, bodies[0], request.headers)
    decode.start(request.path, bodies[1], request.headers)
    watch = asyncio.create_task(watch_prefill(pd.prefill, rid, prefill, decode))
    answered = False
    try:
        first = await decode.next()
        if isinstance(first, Failure):
            pd.decode.suspect(decode_worker)
            return failure_response(first)
        assert isinstance(first, Head)
        if first.status == 200 and first.content_type.startswith("text/event-stream"):
            response, answered = await stream(pd.decode, rid, decode, request, first)
            return response
        reply, answered = await collect(pd.decode, rid, decode, first)
        return reply
    finally:
        if not answered:  # a failure, or the client went away: abort on both servers
            await decode.close()
            pd.decode.end(rid, finished=False)
            pd.handoff.pop(decode_worker, None)  # read its card again: it may have restarted
        settle(pd, watch, PREFILL_GRACE_S if answered else 0.0)


def pd_bodies(payload: Mapping[str, object], room: str, handoff: str) -> tuple[bytes, bytes]:
    """The prefill server's body (no stream, the decode server's address) and the decode
    server's, from the client's ``payload``."""
    prefill = {k: v for k, v in payload.items() if k != "stream_options"}
    prefill |= {"stream": False, "pd": {"room": room, "decode": handoff}}
    decode = {**payload, "pd": {"room": room}}
    return json.dumps(prefill).encode(), json.dumps(decode).encode()


async def watch_prefill(
    service: RouterService, rid: str, prefill: Exchange, decode: Exchange
) -> None:
    """Read the prefill server's answer; if it is an error, fail the decode exchange with it
    (its client gets it)."""
    failure: Failure | None = None
    finished = False
    try:
        head = await prefill.next()
        body = await read_all(prefill) if isinstance(head, Head) else head
        if isinstance(body, Failure):
            if body.connect:
                service.mark_dead(prefill.worker, body.message)
            else:
                service.suspect(prefill.worker)
            failure = Failure(f"prefill worker {prefill.worker} failed: {body.message}")
        elif isinstance(head, Head) and head.status != 200:
            why = f"prefill worker {prefill.worker} answered {head.status}"
            failure = Failure(why, status=head.status, body=body)
        finished = failure is None
    finally:
        await prefill.close()
        service.end(rid, finished)
    if failure is not None:
        log.warning("request %s: %s", rid, failure.message)
        decode.fail(failure.message, failure.status, failure.body)


async def read_all(exchange: Exchange) -> bytes | Failure:
    """The rest of ``exchange``'s body, or how it broke off."""
    chunks: list[bytes] = []
    while True:
        item = await exchange.next()
        if isinstance(item, Failure):
            return item
        if item == END:
            return b"".join(chunks)
        assert isinstance(item, bytes)
        chunks.append(item)


def settle(pd: PDCluster, watch: asyncio.Task[None], grace_s: float) -> None:
    """Let the prefill answer of ``watch`` come for ``grace_s``, then cancel it (which closes
    its connection: the prefill server aborts the request and releases its pages)."""

    async def wait() -> None:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(watch), grace_s)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch

    task = asyncio.get_running_loop().create_task(wait())
    pd.pending.add(task)
    task.add_done_callback(pd.pending.discard)
