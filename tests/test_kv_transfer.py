"""KV pages between two processes: this one sends (``KVSender``), a spawned peer receives
(``KVReceiver``), each with its own CPU ``KVPool`` filled from its own seed.

The peer runs commands from a pipe (bind a receiver, expect, cancel, poll, dump its pool),
so every expectation and every pool byte is checked here. Receivers bind ipc paths in a
temporary directory or 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq
from conftest import spawned

from engine.kvcache.pool import KVPool
from engine.kvcache.transfer import KVReceiver, KVSender
from engine.kvcache.transfer_wire import TransferResult, gather

torch.set_num_threads(1)

SMALL = {"num_layers": 2, "num_pages": 16, "page_size": 4, "num_kv_heads": 2, "head_dim": 8}
LARGE = {"num_layers": 4, "num_pages": 200, "page_size": 16, "num_kv_heads": 8, "head_dim": 64}
SEND_SEED, RECV_SEED = 1, 2
CALL_TIMEOUT_S = 30.0


def make_pool(dtype: str, seed: int, shape: dict[str, int]) -> KVPool:
    """A CPU pool of ``shape`` whose every page (the scratch page too) is random from ``seed``."""
    pool = KVPool(**shape, dtype=getattr(torch, dtype), device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    for layer in [*pool.k, *pool.v]:
        layer.copy_(torch.randn(layer.shape, generator=gen))
    return pool


def pool_bytes(pool: KVPool) -> bytes:
    return b"".join(bytes(t.view(-1).view(torch.uint8).numpy()) for t in [*pool.k, *pool.v])


def digest(pool: KVPool, pages: list[int]) -> str:
    """A hash of ``pages`` of every layer, K and V, in this order."""
    return hashlib.sha256(bytes(gather(pool, pages).view(-1).view(torch.uint8).numpy())).hexdigest()


def page_bytes(dtype: str, shape: dict[str, int]) -> int:
    dims = {k: v for k, v in shape.items() if k != "num_pages"}
    return KVPool.bytes_per_page(**dims, dtype=getattr(torch, dtype))


def peer_main(conn: Connection) -> None:
    """The receiving process: one receiver (and pool) per bound address, driven by ``conn``."""
    torch.set_num_threads(1)
    receivers: dict[str, KVReceiver] = {}
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "stop":
                return
            conn.send(_command(receivers, cmd, args))
    finally:
        for receiver in receivers.values():
            receiver.close()
        conn.close()


def _command(receivers: dict[str, KVReceiver], cmd: str, args: list[Any]) -> Any:
    if cmd == "bind":
        address, dtype, shape = args
        receiver = KVReceiver(address, make_pool(dtype, RECV_SEED, shape))
        receivers[receiver.address] = receiver
        return receiver.address
    receiver = receivers[args[0]]
    if cmd == "expect":
        return receiver.expect(args[1], args[2])
    if cmd == "cancel":
        return receiver.cancel(args[1])
    if cmd == "receive":  # poll until `count` transfers were handled (ended or refused)
        count, timeout_s = args[1:]
        results: list[TransferResult] = []
        refused = receiver.refused
        deadline = time.monotonic() + timeout_s
        while len(results) + receiver.refused - refused < count and time.monotonic() < deadline:
            results += receiver.poll()
            time.sleep(0.001)
        return results
    if cmd == "dump":
        return pool_bytes(receiver.pool)
    if cmd == "digest":
        return digest(receiver.pool, args[1])
    raise ValueError(cmd)


class Peer:
    def __init__(self, conn: Connection, tmp: Path) -> None:
        self.conn = conn
        self.tmp = tmp

    def start(self, *cmd: Any) -> None:
        self.conn.send(cmd)

    def result(self) -> Any:
        if not self.conn.poll(CALL_TIMEOUT_S):
            raise TimeoutError("the peer process did not answer")
        return self.conn.recv()

    def call(self, *cmd: Any) -> Any:
        self.start(*cmd)
        return self.result()

    def bind(self, name: str, dtype: str = "float32", shape: dict[str, int] = SMALL) -> str:
        return str(self.call("bind", f"ipc://{self.tmp}/{name}.sock", dtype, shape))


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    with spawned(peer_main) as conn:
        yield Peer(conn, tmp_path_factory.mktemp("kv"))


@pytest.fixture
def sender() -> Iterator[KVSender]:
    with KVSender(timeout_s=10.0) as s:
        yield s


def transfer(
    peer: Peer, sender: KVSender, address: str, sends: list[tuple[str, KVPool, list[int]]]
) -> tuple[dict[str, TransferResult], dict[str, TransferResult]]:
    """Send every (id, pool, pages) of ``sends`` before the peer polls; the results of
    both sides by id once all have ended."""
    for transfer_id, pool, pages in sends:
        sender.send(address, transfer_id, pool, pages)
    peer.start("receive", address, len(sends), 10.0)
    sent: dict[str, TransferResult] = {}
    deadline = time.monotonic() + 15.0
    while sender.in_flight() and time.monotonic() < deadline:
        sent.update((r.transfer_id, r) for r in sender.poll(timeout_s=1.0))
    received = {r.transfer_id: r for r in peer.result()}
    assert len(sent) == len(sends)
    return sent, received


def landed(dtype: str, moves: dict[int, tuple[KVPool, int]]) -> bytes:
    """The receiver's pool as it must be: its own start with ``moves`` (its page -> the
    sender's pool and page) copied in, nothing else."""
    pool = make_pool(dtype, RECV_SEED, SMALL)
    for dst, (src_pool, src) in moves.items():
        for theirs, ours in zip([*src_pool.k, *src_pool.v], [*pool.k, *pool.v], strict=True):
            ours[dst] = theirs[src]
    return pool_bytes(pool)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pages_land_bit_exact(peer: Peer, sender: KVSender, dtype: str) -> None:
    address = peer.bind(f"exact-{dtype}", dtype)
    pool = make_pool(dtype, SEND_SEED, SMALL)
    peer.call("expect", address, "t1", [10, 11, 12])
    sender.send(address, "t1", pool, [3, 7, 1], n_tokens=10)
    peer.start("receive", address, 1, 10.0)
    [sent] = sender.poll(timeout_s=10.0)
    [received] = peer.result()
    nbytes = 3 * page_bytes(dtype, SMALL)
    for result in (sent, received):
        assert result.ok, result.detail
        assert (result.transfer_id, result.pages, result.nbytes) == ("t1", 3, nbytes)
        assert result.n_tokens == 10 and result.seconds > 0
    expected = landed(dtype, {10: (pool, 3), 11: (pool, 7), 12: (pool, 1)})
    assert peer.call("dump", address) == expected


def test_large_transfer_over_tcp(peer: Peer, sender: KVSender) -> None:
    address = str(peer.call("bind", "tcp://127.0.0.1:*", "float32", LARGE))
    pool = make_pool("float32", SEND_SEED, LARGE)
    src = torch.randperm(200, generator=torch.Generator().manual_seed(3))[:160].tolist()
    dst = list(range(199, 39, -1))
    peer.call("expect", address, "big", dst)
    sent, received = transfer(peer, sender, address, [("big", pool, src)])
    nbytes = 160 * page_bytes("float32", LARGE)
    assert nbytes > 40e6
    for result in (sent["big"], received["big"]):
        assert result.ok, result.detail
        assert result.nbytes == nbytes
    assert peer.call("digest", address, dst) == digest(pool, src)
    rate = nbytes / sent["big"].seconds / 1e6
    print(f"\n{nbytes / 1e6:.1f} MB in {sent['big'].seconds * 1e3:.1f} ms: {rate:.0f} MB/s")


def test_silent_or_dead_peer_times_out(tmp_path: Path) -> None:
    pool = make_pool("float32", SEND_SEED, SMALL)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # takes the transfer, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"ipc://{tmp_path}/silent.sock")
    try:
        with KVSender(timeout_s=0.5) as sender:
            began = time.monotonic()
            sender.send(f"ipc://{tmp_path}/silent.sock", "silent", pool, [1, 2])
            sender.send(f"ipc://{tmp_path}/nobody.sock", "dead", pool, [1, 2])
            assert time.monotonic() - began < 0.25  # send never waits for the peer
            results: list[TransferResult] = []
            while sender.in_flight() and time.monotonic() - began < 5.0:
                results += sender.poll(timeout_s=5.0)
            elapsed = time.monotonic() - began
        assert silent.poll(1000) and len(silent.recv_multipart()) == 3
    finally:
        silent.close()
        ctx.term()
    assert sorted(r.transfer_id for r in results) == ["dead", "silent"]
    for result in results:
        assert result.status == "timeout" and "no acknowledgment" in result.detail
        assert 0.5 <= result.seconds < 1.5
    assert elapsed < 1.5


def test_shape_mismatch_refused(peer: Peer, sender: KVSender) -> None:
    address = peer.bind("mismatch")
    untouched = peer.call("dump", address)
    wrong = {  # id: the sender's pool (dtype, shape), its pages, what the refusal names
        "m-head": ("float32", {**SMALL, "head_dim": 16}, [1, 2, 3], "head dim"),
        "m-dtype": ("bfloat16", SMALL, [1, 2, 3], "dtype"),
        "m-layers": ("float32", {**SMALL, "num_layers": 3}, [1, 2, 3], "layers"),
        "m-count": ("float32", SMALL, [1, 2], "pages 2 != 3"),
    }
    for transfer_id in wrong:
        peer.call("expect", address, transfer_id, [10, 11, 12])
    sends = [(tid, make_pool(d, SEND_SEED, shape), p) for tid, (d, shape, p, _) in wrong.items()]
    sent, received = transfer(peer, sender, address, sends)
    for transfer_id, (*_, why) in wrong.items():
        for result in (sent[transfer_id], received[transfer_id]):
            assert result.status == "mismatch" and why in result.detail, result.detail
    assert peer.call("dump", address) == untouched
    assert not peer.call("cancel", address, "m-head")  # a mismatch ended the expectation


def test_cancelled_or_early_transfer_refused(peer: Peer, sender: KVSender) -> None:
    address = peer.bind("cancel")
    untouched = peer.call("dump", address)
    pool = make_pool("float32", SEND_SEED, SMALL)
    peer.call("expect", address, "aborted", [10, 11])
    assert peer.call("cancel", address, "aborted")
    sends = [("aborted", pool, [1, 2]), ("early", pool, [3])]
    sent, received = transfer(peer, sender, address, sends)
    assert received == {}
    assert sent["aborted"].status == "refused" and "cancelled" in sent["aborted"].detail
    assert sent["early"].status == "refused" and "not expected" in sent["early"].detail
    assert peer.call("dump", address) == untouched
    peer.call("expect", address, "early", [5])  # refused early, sent again once expected: lands
    sent, received = transfer(peer, sender, address, [("early", pool, [3])])
    assert sent["early"].ok and received["early"].ok
    assert peer.call("dump", address) == landed("float32", {5: (pool, 3)})


def test_interleaved_transfers_land(peer: Peer, sender: KVSender) -> None:
    address = peer.bind("interleaved")
    pool = make_pool("float32", SEND_SEED, SMALL)
    peer.call("expect", address, "a", [10, 11])
    peer.call("expect", address, "b", [14, 12, 13])
    sent, received = transfer(peer, sender, address, [("b", pool, [0, 1, 2]), ("a", pool, [5, 6])])
    for transfer_id, pages in (("a", 2), ("b", 3)):
        for result in (sent[transfer_id], received[transfer_id]):
            assert result.ok, result.detail
            assert result.nbytes == pages * page_bytes("float32", SMALL)
    moves = {10: 5, 11: 6, 14: 0, 12: 1, 13: 2}
    expected = landed("float32", {dst: (pool, src) for dst, src in moves.items()})
    assert peer.call("dump", address) == expected


def test_caller_errors_raise(tmp_path: Path) -> None:
    pool = make_pool("float32", SEND_SEED, SMALL)
    with KVReceiver(f"ipc://{tmp_path}/errors.sock", pool) as receiver, KVSender() as sender:
        receiver.expect("x", [1])
        for tid, pages in [("x", [2]), ("y", []), ("y", [16]), ("y", [1, 1])]:
            with pytest.raises(ValueError):
                receiver.expect(tid, pages)
        for pages, n_tokens in [([16], None), ([], None), ([1, 2], 4), ([1, 2], 9)]:
            with pytest.raises(ValueError):
                sender.send(receiver.address, "z", pool, pages, n_tokens)
        with pytest.raises(zmq.ZMQError):
            sender.send("nowhere://at-all", "z", pool, [1])
        assert sender.in_flight() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pool_both_ways(tmp_path: Path) -> None:
    cpu = make_pool("bfloat16", SEND_SEED, SMALL)
    cuda = KVPool(**SMALL, dtype=torch.bfloat16, device=torch.device("cuda"))
    with KVReceiver(f"ipc://{tmp_path}/cuda.sock", cuda) as receiver, KVSender() as sender:
        receiver.expect("up", [4, 5])
        sender.send(receiver.address, "up", cpu, [1, 2])
        while not receiver.poll():
            time.sleep(0.001)
        assert sender.poll(timeout_s=5.0)[0].ok
        with KVReceiver(f"ipc://{tmp_path}/back.sock", cpu) as back:
            back.expect("down", [9, 8])
            sender.send(back.address, "down", cuda, [4, 5])
            while not back.poll():
                time.sleep(0.001)
            assert sender.poll(timeout_s=5.0)[0].ok
    assert torch.equal(cpu.k[1][[9, 8]], cpu.k[1][[1, 2]])
    assert torch.equal(cpu.v[0][[9, 8]], cpu.v[0][[1, 2]])
