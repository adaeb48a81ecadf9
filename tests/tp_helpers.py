"""Tensor-parallel groups for tests: rank 0 in the test process, the others spawned."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.multiprocessing as mp

from engine.runner import RunnerArgs
from engine.runner.tp import TPLeader, follower_main


@contextmanager
def tp_leader(args: RunnerArgs) -> Iterator[TPLeader]:
    """Rank 0 here, ranks 1..tp_size-1 as spawned followers; all stopped at the end."""
    ctx = mp.get_context("spawn")
    followers = [ctx.Process(target=follower_main, args=(args, r)) for r in range(1, args.tp_size)]
    for follower in followers:
        follower.start()
    leader = None
    try:
        leader = TPLeader(args)
        yield leader
        leader.shutdown()
        for follower in followers:
            follower.join(timeout=30)
            assert follower.exitcode == 0, f"follower exit code {follower.exitcode}"
    finally:
        for follower in followers:
            if follower.is_alive():
                follower.kill()
                follower.join(timeout=10)
        if leader is not None and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
