"""Running a sweep's tasks: in this process, in a process pool (forkserver, surviving dead
workers) or on Ray; one row per task stored as it finishes (:func:`run_tasks`, :func:`run_sweep`)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import logging
import multiprocessing
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ...sim.errors import DraftsimError
from .spec import Point, Spec, check_size, validate_points
from .storage import Store, SweepRow, cell, schema_for
from .tasks import Kind, Outcome, Task, execute


def worker_modules(worker) -> set[str]:
    """Modules defining ``worker`` and the functions bound in it (through ``functools.partial``)."""
    out, stack = set(), [worker]
    while stack:
        f = stack.pop()
        if isinstance(f, partial):
            stack.append(f.func)
            stack.extend(a for a in (*f.args, *f.keywords.values()) if callable(a))
        elif callable(f) and getattr(f, "__module__", None) not in (None, "__main__"):
            out.add(f.__module__)
    return out


def _pool_results(worker: Callable, tasks: list[Task], workers: int) -> Iterator[tuple]:
    """Results of ``worker`` over ``tasks`` in completion order: in this process for one worker,
    else in a process pool (forkserver, or spawn) with at most two tasks per worker in flight.
    A worker that dies (killed, out of memory) breaks the pool: its in-flight tasks run again on
    a fresh pool, and a task in flight at two such deaths is recorded as failed."""
    if workers == 1:
        for task in tasks:
            yield worker(task)
        return
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":  # the server imports the worker's modules once; workers fork from it ready
        context.set_forkserver_preload(sorted(worker_modules(worker)))
    queue = collections.deque(tasks)
    running: dict = {}
    crashes: dict[int, int] = {}
    pool = None
    try:
        while queue or running:
            if pool is None:
                pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=context)
            while queue and len(running) < 2 * workers:
                task = queue.popleft()
                running[pool.submit(worker, task)] = task
            finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
            broken = False
            for fut in finished:
                task = running.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    running[fut] = task
                    continue
                yield result
            if broken:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = None
                for task in reversed(list(running.values())):
                    crashes[task.id] = crashes.get(task.id, 0) + 1
                    if crashes[task.id] >= 2:
                        yield Outcome(task.id, {}, "the worker process died running this point (killed, or out of memory)", 0.0, 0.0)
                    else:
                        queue.appendleft(task)
                running.clear()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def ray_available() -> bool:
    """Whether Ray can be imported (the optional ``ray`` extra)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def start_ray(address: str | None, workers: int):
    """Connect to a Ray cluster at ``address``, or start a local one with ``workers`` CPUs
    (no dashboard, loopback only); an initialised Ray is used as it is. Returns the ``ray``
    module and whether this call started it (the caller then shuts it down)."""
    try:
        import ray
    except ImportError:
        raise DraftsimError("--ray needs Ray: pip install 'draftsim[ray]' (or pip install 'ray>=2.9')") from None
    if ray.is_initialized():
        return ray, False
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    else:
        # address="local": a new cluster for this run, even where `ray start` left one to join
        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 _node_ip_address="127.0.0.1")
    return ray, True


def call(worker: Callable, task: Task):
    """``worker(task)``: the function Ray runs remotely (Ray needs a plain function)."""
    return worker(task)


def _ray_results(worker: Callable, tasks: list[Task], workers: int, address: str | None) -> Iterator[tuple]:
    ray, started = start_ray(address, workers)
    remote = ray.remote(num_cpus=1)(call)
    slots = max(2, 2 * int(ray.cluster_resources().get("CPU", workers)))
    queue = iter(tasks)
    handle = ray.put(worker)
    running = [remote.remote(handle, t) for t in itertools.islice(queue, slots)]
    try:
        while running:
            finished, running = ray.wait(running, num_returns=1)
            for ref in finished:
                nxt = next(queue, None)
                if nxt is not None:
                    running.append(remote.remote(handle, nxt))
                yield ray.get(ref)
    finally:
        for ref in running:
            ray.cancel(ref)
        if started:
            ray.shutdown()


@dataclass
class Summary:
    """What a call to :func:`run_sweep` did."""

    folder: Path
    tasks: int
    already_done: int
    ran: int
    failed: int
    seconds: float
    backend: str
    workers: int


def run_tasks(spec: Spec, points: list[Point], tasks: list[Task], worker: Callable, metric_columns: Sequence[str], out,
              workers: int = 1, ray: bool = False, ray_address: str | None = None, resume: bool = False,
              progress: Callable[[int, int, int], None] | None = None, extra: dict | None = None,
              flush_seconds: float = 2.0, text_columns: Sequence[str] = ()) -> Summary:
    """Run ``worker`` over ``tasks`` (those the folder lacks), storing one row per task.

    ``worker(task) -> Outcome`` must be picklable (a
    module-level function or a :func:`functools.partial` of one). Shards are committed at
    most every ``max(flush_seconds, 2 % of the elapsed time)`` and at the end (and on Ctrl-C).
    """
    if workers < 1:
        raise DraftsimError(f"--workers must be >= 1; got {workers}")
    schema = schema_for(spec, points, metric_columns, text_columns)
    store = Store(Store.check(out, spec, resume), spec, schema, len(tasks), extra).open()
    try:
        return _run_into(store, spec, points, tasks, worker, [*metric_columns, *text_columns], workers, ray, ray_address, progress,
                         flush_seconds)
    finally:
        store.close()


def _run_into(store: Store, spec: Spec, points: list[Point], tasks: list[Task], worker: Callable, metric_columns: Sequence[str],
              workers: int, ray: bool, ray_address: str | None, progress, flush_seconds: float) -> Summary:
    schema = store.schema
    by_id = {t.id: t for t in tasks}
    stray = store.done.difference(by_id)
    if stray:
        raise DraftsimError(f"{store.results}: task {min(stray)} is not a task of this sweep; the folder was altered by hand")
    pending = [t for t in tasks if t.id not in store.done]
    already, failed0 = len(store.done), store.failed
    points_by_index = {p.index: p for p in points}
    t0 = last = time.perf_counter()
    ran = 0
    results = _ray_results(worker, pending, workers, ray_address) if ray else _pool_results(worker, pending, workers)
    try:
        for outcome in results:
            task = by_id[outcome.task]
            record = SweepRow(task.id, task.point, task.replication, task.seed, "ok" if outcome.error is None else "failed",
                               outcome.error, outcome.seconds, outcome.cpu_seconds)
            row = asdict(record)
            row.update({name: cell(points_by_index[task.point].values[name], schema.field(name).type) for name in spec.axes})
            row.update({m: outcome.values.get(m) for m in metric_columns})
            store.add(row)
            ran += 1
            if progress is not None:
                progress(already + ran, store.failed + sum(1 for r in store.buffer if r["status"] != "ok"), len(tasks))
            now = time.perf_counter()
            if now - last >= max(flush_seconds, 0.02 * (now - t0)):
                store.flush()
                last = now
    finally:
        store.flush()
        store.write_manifest(complete=len(store.done) == len(tasks))
    return Summary(store.folder, len(tasks), already, ran, store.failed - failed0, time.perf_counter() - t0,
                   "ray" if ray else "pool", workers)


def run_sweep(spec: Spec, kind: Kind, out, workers: int = 1, ray: bool = False, ray_address: str | None = None,
              resume: bool = False, force: bool = False, progress: Callable[[int, int, int], None] | None = None,
              flush_seconds: float = 2.0) -> Summary:
    """Validate every point, then run every task of ``spec`` with ``kind`` into folder ``out``
    (:func:`run_tasks` runs them)."""
    check_size(spec, force)
    points = validate_points(spec, kind)
    tasks = list(spec.tasks(points, seeded=kind.seed_option is not None))
    metric_paths = {m: kind.metrics[m] for m in spec.metrics}
    worker = partial(execute, kind.run, metric_paths)
    return run_tasks(spec, points, tasks, worker, list(spec.metrics), out, workers, ray, ray_address, resume, progress,
                     flush_seconds=flush_seconds)
