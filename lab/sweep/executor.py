"""Where many replays run: a local process pool (the default) or a Ray cluster.

Both run ``fn(shared, task)`` for every task and yield ``(index, result)`` as
tasks finish, in any order. ``fn`` is a module-level function (workers import
it by name); ``shared`` (the trace) travels once to each worker, not with every
task; ``fn`` turns its own errors into results, so a failing task never stops
the others. A worker that dies (killed, out of memory) fails the tasks it was
running, reported through ``on_crash(task, message)``; the rest go on.

- ``LocalPool(jobs)``: ``jobs`` spawned worker processes on this machine
  (default: all cores), at most ``jobs`` tasks in flight.
- ``Serial()``: every task in this process, one after the other (one search of
  a handful of short replays, where a pool's start-up would cost more).
- ``RayExecutor(address, jobs)``: a local Ray runtime when ``address`` is None
  (``jobs`` CPUs), else the cluster at ``address`` (``auto``, ``HOST:PORT`` or
  ``ray://HOST:10001``), whose workers must have this package installed.
  Ray is an optional extra: ``pip install '.[cluster]'``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from engine.runner.host_memory import keep_mmap_threshold

Task = Any
Result = Any
TaskFn = Callable[[Any, Task], Result]
CrashFn = Callable[[Task, str], Result]

_SHARED: Any = None  # a pool worker's copy of ``shared``


class Executor(Protocol):
    name: str

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Task], on_crash: CrashFn
    ) -> Iterator[tuple[int, Result]]: ...

    def close(self) -> None: ...


def _init_worker(shared: Any) -> None:
    global _SHARED
    _SHARED = shared
    keep_mmap_threshold()


def _call(fn: TaskFn, task: Task) -> Result:
    return fn(_SHARED, task)


class Serial:
    """The tasks in this process, in order (see the module docstring)."""

    name = "serial"

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Task], on_crash: CrashFn
    ) -> Iterator[tuple[int, Result]]:
        for i, task in enumerate(tasks):
            yield i, fn(shared, task)

    def close(self) -> None:
        """Nothing to release."""


class LocalPool:
    """Spawned worker processes (spawn, not fork: the parent may hold threads)."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = max(1, jobs or os.cpu_count() or 1)

    def _pool(self, shared: Any) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(shared,),
        )

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Task], on_crash: CrashFn
    ) -> Iterator[tuple[int, Result]]:
        todo = list(range(len(tasks)))[::-1]
        pool = self._pool(shared)
        running: dict[Future[Result], int] = {}
        try:
            while todo or running:
                while todo and len(running) < self.jobs:
                    i = todo.pop()
                    running[pool.submit(_call, fn, tasks[i])] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for future in done:
                    i = running.pop(future)
                    try:
                        yield i, future.result()
                    except BrokenProcessPool as exc:
                        broken = True
                        yield i, on_crash(tasks[i], f"a worker process died ({exc})")
                if broken:  # the others in flight died with it; start afresh for the rest
                    for i in running.values():
                        yield i, on_crash(tasks[i], "a worker process died beside it")
                    running.clear()
                    pool.shutdown(cancel_futures=True)
                    pool = self._pool(shared)
        finally:
            pool.shutdown(cancel_futures=True)

    def close(self) -> None:
        pass


def _ray_call(fn: TaskFn, shared: Any, task: Task) -> Result:
    keep_mmap_threshold()
    return fn(shared, task)


class RayExecutor:
    """Tasks on Ray, one CPU each; ``close()`` shuts the runtime down."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError(
                "--ray needs Ray, an optional extra: pip install '.[cluster]'"
            ) from None
        self.ray = ray
        ray.init(
            address=address,
            num_cpus=jobs if address is None else None,
            include_dashboard=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Task], on_crash: CrashFn
    ) -> Iterator[tuple[int, Result]]:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        ref = ray.put(shared)
        pending = {remote.remote(fn, ref, task): i for i, task in enumerate(tasks)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for obj in done:
                i = pending.pop(obj)
                try:
                    yield i, ray.get(obj)
                except ray.exceptions.RayError as exc:
                    yield i, on_crash(tasks[i], f"the Ray task failed ({type(exc).__name__})")

    def close(self) -> None:
        self.ray.shutdown()


def make_executor(ray: str | None, jobs: int | None) -> Executor:
    """``LocalPool`` unless ``ray`` is given: ``""`` for a local Ray runtime, else an address."""
    if ray is None:
        return LocalPool(jobs)
    return RayExecutor(ray or None, jobs)
