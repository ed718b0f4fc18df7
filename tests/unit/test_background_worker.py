"""The optimizers' background worker (core/background_worker.py): it never
keeps its owner alive, and with VLLM_LAYERSKIP_SYNC_OPTIMIZER=1 it runs each
job in the caller's thread at submit, so a run does not depend on the thread's
timing."""

import gc
import threading
import time
import weakref

from vllm_layerskip.core.background_worker import SYNC_ENV, BackgroundWorker


def test_background_thread_does_not_keep_the_search_alive():
    """An optimizer's thread (SWIFT's, core/background_worker.py) outlives its
    engine (it waits for jobs forever): it must not hold the search, which holds
    the model, once the engine lets go of it."""

    class Search:
        def run(self, job):
            return job * 2

    search = Search()
    worker = BackgroundWorker(search.run, "test-optimizer", stop_on_error=True)
    worker.submit(21)
    deadline = time.monotonic() + 10
    while (done := worker.take()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done is not None and done.value == 42
    alive = weakref.ref(search)
    del search
    gc.collect()
    assert alive() is None
    worker.submit(1)  # the thread sees the search is gone and ends
    worker.thread.join(timeout=10)
    assert not worker.thread.is_alive()


def test_synchronous_mode_runs_each_job_at_submit_in_the_caller_thread(monkeypatch):
    monkeypatch.setenv(SYNC_ENV, "1")
    threads = []

    class Optimizer:
        def run(self, job):
            threads.append(threading.current_thread())
            if job == "fail":
                raise ValueError("broken")
            return job * 2 if job else None

    owner = Optimizer()
    worker = BackgroundWorker(owner.run, "test-optimizer", stop_on_error=True)
    assert not worker.thread.is_alive()  # no thread started
    worker.submit(21)
    done = worker.take()  # published before submit returned
    assert done is not None and done.value == 42
    assert threads == [threading.current_thread()]
    worker.submit(0)  # a job without a result publishes nothing
    assert worker.take() is None and worker.busy_seconds > 0
    worker.submit("fail")  # stop_on_error: the error is kept, later jobs dropped
    assert worker.error == "ValueError('broken')"
    worker.submit(5)
    assert worker.take() is None and len(threads) == 3


def test_synchronous_mode_without_stop_on_error_publishes_the_exception(monkeypatch):
    monkeypatch.setenv(SYNC_ENV, "1")

    def run(job):
        raise RuntimeError(job)

    worker = BackgroundWorker(run, "test-dp", stop_on_error=False)
    worker.submit("one run lost")
    outcome = worker.take()
    assert isinstance(outcome.value, RuntimeError) and str(outcome.value) == "one run lost"
    assert worker.error is None

