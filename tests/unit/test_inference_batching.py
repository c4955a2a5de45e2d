"""The micro-batcher (max batch size, max wait, under concurrency) and the preprocessing worker pool
(resized and re-pinned to CPUs at run time)."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.inference.batching import MicroBatcher  # noqa: E402
from examples.inference.workers import Overloaded, WorkerPool  # noqa: E402


class Recorder:
    """A run_batch that records batch sizes and takes ``cost`` seconds."""

    def __init__(self, cost: float = 0.0) -> None:
        self.sizes: list[int] = []
        self.cost = cost
        self.lock = threading.Lock()

    def __call__(self, items):
        with self.lock:
            self.sizes.append(len(items))
        if self.cost:
            time.sleep(self.cost)
        return [x * 2 for x in items]


def test_max_batch_size_honoured_under_a_burst():
    rec = Recorder(cost=0.02)
    b = MicroBatcher("t", rec, lambda: (4, 0.05))
    try:
        futs: list = []
        lock = threading.Lock()
        start = threading.Barrier(50)

        def client(i: int) -> None:
            start.wait()
            f = b.submit(i)
            with lock:
                futs.append((i, f))
        threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = {i: f.result(5) for i, f in futs}
    finally:
        b.close()
    assert all(results[i].output == 2 * i for i in range(50))    # every answer is its own request's
    assert max(rec.sizes) <= 4 and sum(rec.sizes) == 50
    # a burst of 50 against batches of 4 that take 20 ms: nearly every batch is full
    assert sum(1 for s in rec.sizes if s == 4) >= 10


def test_lone_request_waits_about_max_wait_then_runs_alone():
    rec = Recorder()
    b = MicroBatcher("t", rec, lambda: (64, 0.03))
    try:
        t0 = time.perf_counter()
        done = b.submit(21).result(5)
        took = time.perf_counter() - t0
    finally:
        b.close()
    assert done.output == 42 and done.batch.size == 1 and rec.sizes == [1]
    assert 0.028 <= done.queue_s <= 0.2
    assert took >= 0.028


def test_full_batch_does_not_wait_for_max_wait():
    rec = Recorder()
    b = MicroBatcher("t", rec, lambda: (3, 5.0))      # a 5 s max wait that a full batch must not sit out
    try:
        t0 = time.perf_counter()
        futs = [b.submit(i) for i in range(3)]
        for f in futs:
            f.result(2)
        assert time.perf_counter() - t0 < 1.0
    finally:
        b.close()
    assert rec.sizes == [3]


def test_max_wait_and_size_under_concurrent_trickle():
    rec = Recorder(cost=0.005)
    max_wait = 0.02
    b = MicroBatcher("t", rec, lambda: (8, max_wait))
    waits: list[float] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            d = b.submit(seed).result(5)
            with lock:
                waits.append(d.queue_s)
            time.sleep(rng.uniform(0, 0.01))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        b.close()
    assert len(waits) == 200 and sum(rec.sizes) == 200 and max(rec.sizes) <= 8
    # no request waits much past max_wait plus one batch that was already running (and CI scheduling slack)
    assert max(waits) < max_wait + 0.005 + 0.1
    assert sorted(waits)[len(waits) // 2] <= max_wait + 0.01


def test_limits_are_read_before_every_batch():
    limits = {"size": 2}
    rec = Recorder(cost=0.01)
    b = MicroBatcher("t", rec, lambda: (limits["size"], 0.2))
    try:
        futs = [b.submit(i) for i in range(6)]
        [f.result(5) for f in futs]
        assert max(rec.sizes) == 2
        limits["size"] = 6
        futs = [b.submit(i) for i in range(6)]
        [f.result(5) for f in futs]
    finally:
        b.close()
    assert rec.sizes[-1] == 6


def test_failure_reaches_every_request_of_the_batch_and_the_batcher_goes_on():
    calls = {"n": 0}

    def run(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")
        return items

    b = MicroBatcher("t", run, lambda: (4, 0.05))
    try:
        futs = [b.submit(i) for i in range(4)]
        for f in futs:
            with pytest.raises(RuntimeError, match="device lost"):
                f.result(5)
        assert b.submit(7).result(5).output == 7
    finally:
        b.close()


def test_full_queue_is_refused():
    gate = threading.Event()

    def run(items):
        gate.wait(5)
        return items

    b = MicroBatcher("t", run, lambda: (1, 0.0), max_queue=2)
    try:
        first = b.submit(0)
        deadline = time.monotonic() + 2
        while b.depth() and time.monotonic() < deadline:   # the first is taken and blocks the batcher
            time.sleep(0.005)
        b.submit(1)
        b.submit(2)
        with pytest.raises(Overloaded, match="full"):
            b.submit(3)
        gate.set()
        assert first.result(5).output == 0
    finally:
        gate.set()
        b.close()


# --------------------------------------------------------------------------------------------
# the worker pool
# --------------------------------------------------------------------------------------------
def _wait(cond, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_pool_runs_tasks_and_passes_errors():
    pool = WorkerPool(3)
    try:
        assert [pool.submit(pow, i, 2).result(5) for i in range(10)] == [i * i for i in range(10)]
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(5)
    finally:
        pool.close()


def test_pool_resizes_at_run_time():
    pool = WorkerPool(2)
    try:
        assert _wait(lambda: pool.size() == 2)
        pool.resize(5)
        assert _wait(lambda: pool.size() == 5)
        pool.resize(1)
        assert _wait(lambda: pool.size() == 1)
        # one worker: tasks run one at a time
        active, peak, lock = [0], [0], threading.Lock()

        def task():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.01)
            with lock:
                active[0] -= 1
        futs = [pool.submit(task) for _ in range(10)]
        [f.result(5) for f in futs]
        assert peak[0] == 1
    finally:
        pool.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_pool_confines_its_workers_to_one_core_and_back():
    allowed = sorted(os.sched_getaffinity(0))
    one = allowed[-1]
    pool = WorkerPool(3)
    try:
        assert _wait(lambda: len(pool.native_ids()) == 3)
        pool.set_affinity((one,))
        # idle workers re-apply within their tick (0.2 s); the main thread is left alone
        assert _wait(lambda: all(os.sched_getaffinity(t) == {one} for t in pool.native_ids()), timeout=2.0)
        assert sorted(os.sched_getaffinity(0)) == allowed
        where = pool.submit(lambda: sorted(os.sched_getaffinity(0))).result(5)
        assert where == [one]
        pool.set_affinity(None)
        assert _wait(lambda: all(sorted(os.sched_getaffinity(t)) == allowed for t in pool.native_ids()), timeout=2.0)
    finally:
        pool.close()


def test_pool_queue_bound():
    gate = threading.Event()
    pool = WorkerPool(1, max_queue=2)
    try:
        pool.submit(gate.wait, 5)
        assert _wait(lambda: pool.busy() == 1)
        pool.submit(gate.wait, 5)
        pool.submit(gate.wait, 5)
        with pytest.raises(Overloaded, match="preprocess queue full"):
            pool.submit(gate.wait, 5)
    finally:
        gate.set()
        pool.close()
