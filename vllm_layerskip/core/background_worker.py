"""One background thread for an optimizer's slow work (SWIFT's Gaussian process,
CLaSp's DP on a KV snapshot), off the decoding path.

The engine thread submits jobs; the thread runs them one at a time, in order,
and publishes the latest non-None result, which the engine thread takes at a
step boundary (`take`). Decoding never waits for it.

- The job function is held weakly when it is a bound method: the thread never
  ends on its own (it waits for jobs), and a strong reference would keep its
  owner, and through it the model, alive after the engine is gone in a process
  that builds several engines. Once the owner is gone, the next job ends it.
- Errors: `stop_on_error` ends the thread at the first failure and keeps it in
  `error` (SWIFT: the optimizer's state is then unknown, optimization stops);
  otherwise the exception is published as the job's outcome and the thread goes
  on (CLaSp: one failed DP run costs that run).
- Its wall and CPU seconds are counted, for the optimizer's time budget
  (core/optimizer_budget.py): on cores the engine keeps busy, every second it
  computes is taken from decoding.
- SYNC_ENV=1 (tests, reproducing a run): no thread; each job runs in the
  engine thread when it is submitted, so what the optimizer learns no longer
  depends on when the thread got the cores. Its seconds are counted alike.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("vllm.layerskip")

SYNC_ENV = "VLLM_LAYERSKIP_SYNC_OPTIMIZER"


@dataclass
class Outcome:
    value: Any  # the job's result, or the exception it raised (stop_on_error=False)
    seconds: float  # wall time of the job


class BackgroundWorker:
    def __init__(self, run: Callable[[Any], Any], name: str, *, stop_on_error: bool,
                 enabled: bool = True):
        self._run = weakref.WeakMethod(run) if hasattr(run, "__self__") else (lambda: run)
        self.name = name
        self.stop_on_error = stop_on_error
        # Disabled (tensor-parallel ranks other than 0, which take rank 0's
        # decisions): no thread, and submitted jobs are dropped.
        self.enabled = enabled
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._published: Outcome | None = None
        self.error: str | None = None  # the failure that stopped it (stop_on_error)
        self.busy_seconds = 0.0
        self.cpu_seconds = 0.0  # this thread's CPU time (time.thread_time)
        self.synchronous = os.environ.get(SYNC_ENV, "0") == "1"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        if enabled and not self.synchronous:
            self.thread.start()

    def submit(self, job: Any) -> None:
        if not self.enabled or self.error is not None:
            return
        if self.synchronous:
            self._run_job(job)
        else:
            self._jobs.put(job)

    def take(self) -> Outcome | None:
        """The latest published outcome, once; None if there is none new."""
        with self._lock:
            outcome, self._published = self._published, None
        return outcome

    @property
    def has_result(self) -> bool:
        with self._lock:
            return self._published is not None

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if not self._run_job(job):
                return
            del job  # a job can be large: dropped before waiting

    def _run_job(self, job: Any) -> bool:
        """Runs one job and publishes its result; False once the worker is done
        (its owner is gone, or it stopped at an error)."""
        run = self._run()
        if run is None:  # the owner is gone with its engine
            return False
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            value = run(job)
        except Exception as e:  # noqa: BLE001 - reported to the engine thread
            if self.stop_on_error:
                logger.exception("vllm-layerskip: background thread %s failed", self.name)
                self.error = repr(e)
                return False
            value = e
        finally:
            self.busy_seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu_start
        if value is not None:  # published after its cost is counted
            with self._lock:
                self._published = Outcome(value, time.perf_counter() - start)
        return True
