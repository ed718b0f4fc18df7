"""Keeps a background thread's model calls apart from the engine's.

vLLM's CPU kernels are not safe to run from two threads at once: its linear
layers run through oneDNN handlers that share one process-wide scratchpad and
a primitive cache (two concurrent calls gave NaN and then a segfault here), and
the model's plain weights are dropped after packing, so a thread cannot use
torch's own matmul instead without a second copy of the model.

So the engine thread holds the gate while it runs the model (the runner's
execute_model and sample_tokens, patches/model_runner.py), and a background
thread takes it for one layer call at a time, only while the engine does not
want it. The engine then waits at most for one background layer call to end;
the background work fills the time the worker spends between steps (waiting
for the scheduler, the engine's output processing).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class ModelGate:
    POLL_S = 0.0005  # how often a waiting background thread looks again

    def __init__(self):
        self._lock = threading.RLock()  # re-entrant: the engine side may nest
        self._engine_waiting = 0
        self.engine_wait_seconds = 0.0  # engine time spent waiting for a background call
        self.engine_waits = 0

    @contextmanager
    def engine(self):
        self._engine_waiting += 1
        start = time.perf_counter()
        if not self._lock.acquire(blocking=False):
            self._lock.acquire()
            self.engine_waits += 1
            self.engine_wait_seconds += time.perf_counter() - start
        self._engine_waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    @contextmanager
    def background(self):
        while True:
            while self._engine_waiting:
                time.sleep(self.POLL_S)
            self._lock.acquire()
            if not self._engine_waiting:
                break
            self._lock.release()  # the engine asked meanwhile: it goes first
        try:
            yield
        finally:
            self._lock.release()
