"""``engine.runner.host_memory``: the engine's CPU runner keeps large blocks freed at every
step; the simulator's commands give freed buffers back to the operating system."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a CPU decode step's gathers: each layer's K and V of 40,980 padded tokens (30 MiB each,
# SmolLM2's 3 KV heads of 64) gathered from the pool and freed; the minor page faults that
# 5 steps of 4 layers cost once the first step ran
STEPS = """
import resource, sys
import engine.runner.model_runner  # what a runner process has imported (and allocated) first
from engine.runner.host_memory import M_MMAP_THRESHOLD, keep_large_blocks, mallopt
if sys.argv[1] == "keep":
    assert keep_large_blocks()
else:  # glibc's default threshold, held there (a large free before may otherwise raise it)
    assert mallopt((M_MMAP_THRESHOLD, 128 << 10))
import torch
pool = torch.zeros(70000, 3, 64)
slots = torch.randperm(70000)[:40980]
def step():
    for _ in range(4):
        k = pool.index_select(0, slots)
        v = pool.index_select(0, slots)
        del k, v
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True,
                          cwd=ROOT, check=True)  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_gathers_of_a_decode_step_reuse_their_blocks_without_page_faults() -> None:
    pages = 5 * 4 * 2 * (40980 * 3 * 64 * 4) // 4096
    assert faults("default") > 0.5 * pages  # every gather faults its block in again
    assert faults("keep") < 0.02 * pages  # kept on the heap: reused as it is


# 24 blocks of 1 MiB freed after a 16 MiB one: the bytes still resident once all are freed
GIVE_BACK = """
import sys
from engine.runner.host_memory import keep_mmap_threshold
if sys.argv[1] == "fix":
    assert keep_mmap_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = bytearray(16 << 20)
del big  # by default glibc raises its mmap threshold past 1 MiB here
base = rss()
blocks = [bytearray(1 << 20) for _ in range(24)]
del blocks
print(rss() - base)
"""


def kept_bytes(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", GIVE_BACK, mode], capture_output=True,
                          text=True, cwd=ROOT, check=True)  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_fixed_mmap_threshold_gives_freed_buffers_back() -> None:
    assert kept_bytes("default") > 16 << 20  # the 1 MiB blocks came from the heap and stay
    assert kept_bytes("fix") < 1 << 20  # each was mapped on its own and unmapped when freed
