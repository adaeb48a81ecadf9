"""When each iteration of a fast-forwarded decode run begins, launches, runs and ends.

``SimSchedulerLoop`` prices a run of ``k`` identical decode steps at once
(``sim.model.scheduler_loop``); these are its clocks, as stepping one by one
would give them. Iteration ``j`` begins at ``begins[j]``, its launch returns at
``returned[j]``, its step runs on the device from ``starts[j]`` to
``step_ends[j]``, and it ends at ``ends[j]``: strict, when its step's tokens
leave; overlapped, when it has completed the step before it (the plan in flight
when the run began, for ``j`` = 0), whose tokens leave then.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class RunTimes(NamedTuple):
    begins: np.ndarray
    starts: np.ndarray
    step_ends: np.ndarray
    ends: np.ndarray
    returned: np.ndarray
    durations: np.ndarray  # each step's time on the device (strict: the whole iteration)


def strict_run(now: float, gpu: np.ndarray, schedule: float, detok: float) -> RunTimes:
    """Step j runs [begin, begin + schedule + gpu_j + detok]; its tokens leave at its end."""
    durations = gpu + (schedule + detok)
    clock = np.empty(len(gpu) + 1)  # now, then end j = start j + duration j
    clock[0] = now
    clock[1:] = durations
    np.add.accumulate(clock, out=clock)
    begins, ends = clock[:-1], clock[1:]
    return RunTimes(begins, begins, ends, ends, begins + schedule, durations)


def overlapped_run(
    now: float,
    prev_end: float,
    cpu: np.ndarray,
    gpu: np.ndarray,
    detok: float,
    hold: np.ndarray | None = None,
) -> RunTimes:
    """The overlapped iterations, the first with a step in flight that ends at ``prev_end``.

    ``cpu``: each iteration's host time before its step may start on the device;
    ``hold``: how long its launch holds the host from its beginning, where measured.
    Without it the host is free once the step may start, so the device starts step j at
    ``max(s_{j-1} + cpu_j + detok, s_{j-1} + gpu_{j-1})`` (iteration j first completes step
    j-1 and detokenizes it). With it, one iteration after another: the launch returns at
    ``b_j + hold_j``, the step starts at ``max(b_j + cpu_j, e_{j-1})`` and ends no sooner than
    the launch returns; the host then completes step j-1 once both its launch returned and
    step j-1 ended, detokenizes, and begins j+1.
    """
    if hold is None:
        gaps = np.maximum(gpu[:-1], cpu[1:] + detok)
        starts = np.concatenate(([max(now + cpu[0], prev_end)], gaps)).cumsum()
        ends = starts + detok if detok else starts
        begins = np.concatenate(([now], ends[:-1]))  # iteration j begins as j-1 ends
        return RunTimes(begins, starts, starts + gpu, ends, begins + cpu, gpu)
    k = len(gpu)
    out = np.empty((5, k))
    b, e_prev = now, prev_end
    for j in range(k):
        ret = b + float(hold[j])
        start = max(b + float(cpu[j]), e_prev)
        end = max(start + float(gpu[j]), ret)
        done = max(ret, e_prev) + detok
        out[:, j] = (b, start, end, done, ret)
        b, e_prev = done, end
    begins, starts, step_ends, ends, returned = out
    return RunTimes(begins, starts, step_ends, ends, returned, step_ends - starts)
