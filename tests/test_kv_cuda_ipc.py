"""KV pages between two processes through CUDA IPC (``engine.kvcache.cuda_ipc``): a spawned
sender's pool on this GPU, read by a receiver here, device to device.

On a machine without CUDA only the refusals run: a receiver refuses a transfer whose pages it
cannot read (another shape, outside the sender's pool, on another GPU), and a sender whose pool
is not on a GPU sends the bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq
from conftest import spawned

from engine.kvcache.cuda_ipc import device_uuid
from engine.kvcache.pool import KVPool
from engine.kvcache.transfer import KVReceiver, KVSender
from engine.kvcache.transfer_wire import (
    CudaSource,
    IpcTensor,
    TransferResult,
    decode_ack,
    encode,
    header_for,
)

SHAPE = {"num_layers": 3, "num_pages": 64, "page_size": 4, "num_kv_heads": 2, "head_dim": 16}
CALL_TIMEOUT_S = 60.0
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def filled(device: str, seed: int) -> KVPool:
    pool = KVPool(**SHAPE, dtype=torch.bfloat16, device=torch.device(device))
    gen = torch.Generator().manual_seed(seed)
    for layer in [*pool.k, *pool.v]:
        layer.copy_(torch.randn(layer.shape, generator=gen))
    return pool


def page_bytes() -> int:
    dims = {k: v for k, v in SHAPE.items() if k != "num_pages"}
    return KVPool.bytes_per_page(**dims, dtype=torch.bfloat16)


def pages_of(pool: KVPool, pages: list[int]) -> list[torch.Tensor]:
    return [t[pages].cpu() for t in [*pool.k, *pool.v]]


def sender_main(conn: Connection) -> None:
    """Sends pages of its CUDA pool on command; answers with the pages it sent (on the host)
    and, on ``poll``, the sender's results. ``delay_ms`` keeps the GPU busy before the send,
    so the receiver's copy must wait for the sender's work."""
    pool = filled("cuda", 1)
    with KVSender(timeout_s=30.0) as sender:
        while True:
            cmd, *args = conn.recv()
            if cmd == "stop":
                return
            if cmd == "send":
                address, tid, pages, peer, delay_ms = args
                if delay_ms:  # a long kernel, then the pages rewritten behind it
                    # (indexed by a device tensor: a list index would copy from the host and
                    # so wait for the kernel, and the send would leave after the work)
                    index = torch.tensor(pages, device="cuda")
                    torch.cuda._sleep(int(delay_ms * 2_000_000))  # type: ignore[no-untyped-call]
                    for t in [*pool.k, *pool.v]:
                        t[index] = t[index] * 2 + 1
                sender.send(address, tid, pool, pages, None, peer)
                torch.cuda.synchronize()
                conn.send(pages_of(pool, pages))
            elif cmd == "poll":
                conn.send(sender.poll(timeout_s=args[0]))


class Sender:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        if not self.conn.poll(CALL_TIMEOUT_S):
            raise TimeoutError("the sender process did not answer")
        return self.conn.recv()


@pytest.fixture(scope="module")
def sender() -> Iterator[Sender]:
    with spawned(sender_main) as conn:
        yield Sender(conn)


def received(receiver: KVReceiver, timeout_s: float = 30.0) -> list[TransferResult]:
    deadline = time.monotonic() + timeout_s
    results: list[TransferResult] = []
    while not results and time.monotonic() < deadline:
        results = receiver.poll()
        time.sleep(0.001)
    return results


@cuda
def test_pages_land_device_to_device(sender: Sender, tmp_path: Path) -> None:
    pool = filled("cuda", 2)
    before = pages_of(pool, list(range(SHAPE["num_pages"])))
    with KVReceiver(f"ipc://{tmp_path}/r.sock", pool) as receiver:
        assert receiver.device == device_uuid(torch.device("cuda"))
        # "b" rewrites its pages behind a long kernel: the copy must wait for the sender's work
        cases = [("a", [1, 2, 7], [5, 3, 9], 0), ("b", [7, 0], [40, 41], 50)]
        for tid, src, dst, delay_ms in cases:
            receiver.expect(tid, dst)
            sent = sender.call("send", receiver.address, tid, src, receiver.device, delay_ms)
            results = received(receiver)
            assert [r.transfer_id for r in results] == [tid] and results[0].ok
            assert results[0].nbytes == len(src) * page_bytes()
            for ours, theirs in zip(pages_of(pool, dst), sent, strict=True):
                assert torch.equal(ours, theirs)
            acks = sender.call("poll", 10.0)
            assert [(r.transfer_id, r.status) for r in acks] == [(tid, "ok")]
    touched = {5, 3, 9, 40, 41}
    after = pages_of(pool, list(range(SHAPE["num_pages"])))
    for old, new in zip(before, after, strict=True):
        rest = [p for p in range(SHAPE["num_pages"]) if p not in touched]
        assert torch.equal(old[rest], new[rest])


@cuda
def test_cancel_waits_for_the_copy(sender: Sender, tmp_path: Path) -> None:
    """A transfer cancelled while its copy waits on the sender's work: the cancel returns once
    the copy ran, the sender hears it refused, and no later poll reports it. (A first
    transfer opens the sender's pool here, which may take longer than the sender's work.)"""
    pool = filled("cuda", 3)
    with KVReceiver(f"ipc://{tmp_path}/c.sock", pool) as receiver:
        receiver.expect("w", [20])
        sender.call("send", receiver.address, "w", [5], receiver.device, 0)
        assert received(receiver)[0].ok
        assert [r.status for r in sender.call("poll", 10.0)] == ["ok"]
        receiver.expect("c", [10, 11])
        sender.conn.send(("send", receiver.address, "c", [3, 4], receiver.device, 1000))
        try:
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while not receiver._landing and time.monotonic() < deadline:  # the copy started
                assert receiver.poll() == []
                time.sleep(0.001)
            assert receiver.cancel("c")
        finally:  # the sender's answer, read even when the test fails (the next test's is next)
            sent = sender.conn.recv()
        assert [r.status for r in sender.call("poll", 10.0)] == ["refused"]
        assert receiver.poll() == []
        for ours, theirs in zip(pages_of(pool, [10, 11]), sent, strict=True):
            assert torch.equal(ours, theirs)  # the copy finished before the cancel returned


@cuda
def test_another_device_gets_the_bytes(sender: Sender, tmp_path: Path) -> None:
    """A receiver on the CPU: the sender is told no GPU and sends the bytes."""
    pool = filled("cpu", 4)
    with KVReceiver(f"ipc://{tmp_path}/h.sock", pool) as receiver:
        assert receiver.device == ""
        receiver.expect("h", [1])
        sent = sender.call("send", receiver.address, "h", [2], receiver.device, 0)
        assert received(receiver)[0].ok
        for ours, theirs in zip(pages_of(pool, [1]), sent, strict=True):
            assert torch.equal(ours, theirs)


def fake_layer(pages: int, page: list[int]) -> IpcTensor:
    """A layer tensor's description as a sender would send it (its handle opens nothing)."""
    return IpcTensor([pages, *page], [1], 0, 0, b"h", 0, 0, b"r", 0, b"", False)


PAGE = [SHAPE["page_size"], SHAPE["num_kv_heads"], SHAPE["head_dim"]]
LAYERS = 2 * SHAPE["num_layers"]


@pytest.mark.parametrize(
    ("layers", "pages", "device", "why"),
    [
        ([fake_layer(65, PAGE)] * (LAYERS - 1), [0, 1], "", "layer tensors"),
        ([fake_layer(65, [*PAGE[:-1], 8])] * LAYERS, [0, 1], "", "pages shaped otherwise"),
        ([fake_layer(65, PAGE)] * LAYERS, [0, 65], "", "outside the sender's 65"),
        ([fake_layer(65, PAGE)] * LAYERS, [0, 1], "GPU-elsewhere", "not one GPU"),
    ],
)
def test_a_source_this_receiver_cannot_read_is_refused(
    tmp_path: Path, layers: list[IpcTensor], pages: list[int], device: str, why: str
) -> None:
    """A header naming pages of another shape, out of the sender's pool or on another GPU
    than the receiver's: refused before any copy, nothing written."""
    pool = filled("cpu", 5)
    before = pages_of(pool, list(range(SHAPE["num_pages"])))
    header = header_for("x", pool, 2, None, CudaSource(device, "share", layers, pages, b""))
    with KVReceiver(f"ipc://{tmp_path}/x.sock", pool) as receiver:
        receiver.expect("x", [6, 7])
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.connect(receiver.address)
            sock.send_multipart([encode(header), b""])
            results = received(receiver)
            assert sock.poll(10_000)
            ack = decode_ack(sock.recv())
        finally:
            sock.close(linger=0)
            ctx.term()
    assert [r.status for r in results] == ["mismatch"] and why in results[0].detail
    assert ack is not None and ack.status == "mismatch"
    for old, new in zip(before, pages_of(pool, list(range(SHAPE["num_pages"]))), strict=True):
        assert torch.equal(old, new)


def test_a_cpu_pool_never_shares(tmp_path: Path) -> None:
    """A sender whose pool is not on a GPU sends bytes whatever device the receiver names."""
    src, dst = filled("cpu", 6), filled("cpu", 7)
    with KVReceiver(f"ipc://{tmp_path}/p.sock", dst) as receiver, KVSender() as sender:
        receiver.expect("p", [8])
        sender.send(receiver.address, "p", src, [9], None, "GPU-some")
        assert received(receiver)[0].ok
        assert sender.poll(timeout_s=10.0)[0].ok
    for a, b in zip(pages_of(src, [9]), pages_of(dst, [8]), strict=True):
        assert torch.equal(a, b)
