"""Tensor parallelism across processes: rank 0 decides, ranks 1..N-1 follow.

Rank 0 (``TPLeader``, inside the scheduler process) broadcasts every step as
msgpack bytes, ``[plan.to_dict(), StepInputs]``, over a gloo control group,
then launches it; each follower receives the same bytes and launches the same
step, so the model's all-reduces line up, and samples the same tokens (which
the next step may read on the device, see ``ModelRunner``). A negative length
announces shutdown.

Wire format on the control group, per message::

    broadcast int64[1]  length in bytes (-1: shutdown)
    broadcast uint8[length]  msgpack payload

Model collectives (all-reduce) use the default group: gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from core.scheduler.plan import Plan
from engine.runner.args import RunnerArgs
from engine.runner.inputs import StepInputs, StepOutput
from engine.runner.model_runner import ModelRunner, device_for
from engine.runner.step import StepHandle

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
IDLE_TIMEOUT = timedelta(days=30)  # a follower waits this long for the next step
SHUTDOWN = -1

_decoder = msgspec.msgpack.Decoder(tuple[dict[str, Any], StepInputs])


def init_tp_group(args: RunnerArgs, rank: int) -> Any:
    """Join the default group (model collectives) and return the gloo control group."""
    device = device_for(args, rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=args.dist_init,
        world_size=args.tp_size,
        rank=rank,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def encode_step(plan: Plan, inputs: StepInputs) -> bytes:
    return msgspec.msgpack.encode((plan.to_dict(), inputs))


def decode_step(data: bytes) -> tuple[Plan, StepInputs]:
    plan_dict, inputs = _decoder.decode(data)
    return Plan.from_dict(plan_dict), inputs


def _broadcast_bytes(data: bytes | None, group: Any) -> None:
    header = torch.tensor([SHUTDOWN if data is None else len(data)], dtype=torch.int64)
    dist.broadcast(header, src=0, group=group)
    if data:
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=group)


def _receive_bytes(group: Any) -> bytes | None:
    header = torch.empty(1, dtype=torch.int64)
    dist.broadcast(header, src=0, group=group)
    length = int(header.item())
    if length == SHUTDOWN:
        return None
    payload = torch.empty(length, dtype=torch.uint8)
    if length:
        dist.broadcast(payload, src=0, group=group)
    return payload.numpy().tobytes()


class TPLeader:
    """Rank 0: owns a ``ModelRunner`` and keeps the followers in step.

    With ``tp_size == 1`` it is a thin wrapper: no process group is created.
    """

    def __init__(self, args: RunnerArgs) -> None:
        args.validate()
        self.args = args
        self.group: Any = None
        if args.tp_size > 1:
            self.group = init_tp_group(args, 0)
        self.runner = ModelRunner(args, 0)
        self._closed = False

    def launch(self, plan: Plan, inputs: StepInputs) -> StepHandle:
        """Send the step to the followers and start it here (see ``ModelRunner.launch``)."""
        if self._closed:
            raise RuntimeError("launch() after shutdown()")
        if self.group is not None and (plan.has_model_work or plan.has_copies or inputs.released):
            _broadcast_bytes(encode_step(plan, inputs), self.group)
        return self.runner.launch(plan, inputs)

    def step(self, plan: Plan, inputs: StepInputs) -> StepOutput:
        """Run ``plan`` on every rank and wait; tokens for ``plan.sampling_rids()``."""
        return self.launch(plan, inputs).result()

    def shutdown(self) -> None:
        """Tell the followers to exit and leave the process group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.group is not None:
            try:
                _broadcast_bytes(None, self.group)
            finally:
                self.runner.close()
                dist.destroy_process_group()


def _watch_parent(parent: int, interval_s: float = 1.0) -> None:
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent:
            log.error("tp follower: parent process %d is gone, exiting", parent)
            os._exit(1)


def follower_main(args: RunnerArgs, rank: int) -> None:
    """Entry point of tensor-parallel rank ``rank >= 1``: follow rank 0 until shutdown.

    Exits when rank 0 announces shutdown, when the group breaks (rank 0 died),
    or when this process's parent disappears.
    """
    if rank < 1 or rank >= args.tp_size:
        raise ValueError(f"follower rank must be in [1, {args.tp_size}), got {rank}")
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    group = init_tp_group(args, rank)
    runner: ModelRunner | None = None
    try:
        runner = ModelRunner(args, rank)
        while True:
            try:
                data = _receive_bytes(group)
            except RuntimeError as exc:  # gloo: the connection to rank 0 closed
                log.error("tp rank %d: lost rank 0, exiting: %s", rank, exc)
                raise SystemExit(1) from None
            if data is None:
                break
            plan, inputs = decode_step(data)
            try:
                runner.launch(plan, inputs)
            except ValueError as exc:  # a bad plan: rank 0 rejected it too, before any collective
                log.error("tp rank %d: step %d rejected: %s", rank, plan.step, exc)
    finally:
        if runner is not None:
            runner.close()
        dist.destroy_process_group()
