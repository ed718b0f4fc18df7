"""When CLaSp's DP runs, on which requests, on which thread, and what is kept
when it fails (proposer.py says what CLaSp does and why)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from vllm_layerskip.core.background_worker import BackgroundWorker
from vllm_layerskip.core.draft_engine import DraftRequests
from vllm_layerskip.core.faults import maybe_fail
from vllm_layerskip.core.model_gate import ModelGate
from vllm_layerskip.core.optimizer_budget import OptimizerBudget
from vllm_layerskip.core.rank_agreement import SingleRank
from vllm_layerskip.core.skip_mask import SkipMask
from vllm_layerskip.methods.clasp.dp_snapshot import DPSnapshot, SnapshotTaker, SnapshotUnsupported
from vllm_layerskip.methods.clasp.layer_dp import DPResult, clasp_dp
from vllm_layerskip.methods.clasp.options import ClaspOptions

logger = logging.getLogger("vllm.layerskip")

MAX_CONSECUTIVE_FAILURES = 3


def evenly_spread_layers(num_layers: int, count: int, protected=frozenset()) -> tuple[int, ...]:
    """`count` unprotected layers spread evenly, avoiding the first and last
    layer when enough others remain."""
    candidates = [i for i in range(num_layers) if i not in protected]
    inner = [i for i in candidates if 0 < i < num_layers - 1]
    if len(inner) >= count:
        candidates = inner
    step = len(candidates) / count
    return tuple(candidates[int(step * k + step / 2)] for k in range(count))


class ClaspSearch:
    """When the DP runs, on which requests, and what is kept when it fails."""

    def __init__(self, options: ClaspOptions, num_layers: int, agreement=None, background=False):
        self.options = options
        # Background mode: DP runs on snapshots in this thread; None: engine thread.
        self.updater: BackgroundWorker | None = (
            BackgroundWorker(self.run_dp_on_snapshot, "layerskip-clasp-dp", stop_on_error=False)
            if background else None
        )
        self.gate = ModelGate()  # the thread's layer calls vs the engine's model work
        self.snapshots: SnapshotTaker | None = None  # built on first use (needs the model)
        self.in_flight: tuple[int, int] | None = None  # (launch step, requests) of the running job
        self.snapshot_seconds = 0.0
        self.snapshot_bytes = 0  # of the last snapshot
        self.busy_waits = 0  # due runs put off because the last one was still running
        self.delay_steps = 0  # sum over runs of steps from launch to adoption
        self.dp_compute_seconds = 0.0  # background: time in layer calls (the rest is waiting)
        self.agreement = agreement or SingleRank()
        self.num_layers = num_layers
        self.num_skip = options.num_skipped(num_layers)
        first, last = options.protect_first_layers, options.protect_last_layers
        self.protected = frozenset(range(first)) | frozenset(range(num_layers - last, num_layers))
        # Drafts before the first DP run (and if it fails) use an even spread.
        self.skipped = evenly_spread_layers(num_layers, self.num_skip, self.protected)
        self.mask = SkipMask.whole_layers(num_layers, self.skipped)
        self.steps = 0
        self.next_dp_step = 1
        self.deferred = 0  # due DP runs put off while drafting was off
        self.rotation = 0
        self.stopped = False
        self.error = ""
        self.failures = self.consecutive_failures = 0
        self.dp_runs = self.dp_requests = self.mask_changes = 0
        self.dp_seconds = 0.0
        # max_optimizer_share: engine-thread DP runs and the background thread's
        # layer calls are charged here; a due run waits while it is overdrawn.
        self.budget = OptimizerBudget(options.max_optimizer_share)
        self.charged_compute = 0.0  # background layer-call seconds already charged
        self.budget_skips = 0
        self.score_sum = 0.0
        self.last_score: float | None = None
        self.jaccard_sum = 0.0  # similarity of consecutive skip sets (paper Fig. 3a)
        self.mask_log: list[tuple[int, tuple[int, ...]]] = []  # (step, set) of each switch
        logger.info(
            "vllm-layerskip clasp: M=%d of %d layers, DP every %d steps (%s), first mask %s",
            self.num_skip, num_layers, options.layer_optimization_interval,
            "background thread" if background else "engine thread", list(self.skipped),
        )

    def step(self, runner, engine, requests: DraftRequests, drafting: bool = True) -> None:
        self.steps += 1
        self.budget.step(time.perf_counter())
        compute = self.dp_compute_seconds  # written by the background thread
        self.budget.charge(compute - self.charged_compute)
        self.charged_compute = compute
        if self.updater is not None:
            # The step boundary: a run that finished since the last step swaps
            # its mask in now, before this step's draft, which then uses it.
            self._take_background_result()
        if self.stopped or self.steps < self.next_dp_step:
            return
        picked = self._pick(requests)
        if picked.size == 0:
            return
        if not drafting:
            self.deferred += 1
            return
        # Time is rank-local: rank 0 decides whether the budget allows a run now.
        if not self.agreement.share(self.budget.allows()):
            self.budget_skips += 1  # due again next step
            return
        if self.updater is not None and self._launch_background(runner, engine, requests, picked):
            return
        self.next_dp_step = self.steps + self.options.layer_optimization_interval
        start = time.perf_counter()
        error = None
        try:
            result = self.run_dp(runner, engine, requests, picked)
        except Exception as e:  # noqa: BLE001 - a DP failure must not stop serving
            result, error = None, e
        finally:
            elapsed = time.perf_counter() - start
            self.dp_seconds += elapsed
            self.budget.charge(elapsed)
        result = self.agreement.share(result)  # rank 0's; None if it failed there
        if result is None:
            self._failed(error or RuntimeError("the DP run failed on tensor-parallel rank 0"))
            return
        self._adopt(result, picked.size)

    @torch.inference_mode()
    def run_dp(self, runner, engine, requests: DraftRequests, picked: np.ndarray) -> DPResult:
        rows = requests.rows[picked]
        positions = requests.last_position[picked] - 1  # the last verified token
        input_ids = runner.input_batch.token_ids_cpu[rows, positions].astype(np.int64)
        x0 = engine.stack.embed(torch.from_numpy(input_ids).to(runner.device))
        maybe_fail("clasp.dp")
        metadata = {}  # per state count n: (rows, positions, attention metadata)

        def layer_fn(i: int, states: torch.Tensor) -> torch.Tensor:  # [R, n, H]
            r, n, h = states.shape
            if n not in metadata:
                cand_rows, cand_pos = np.repeat(rows, n), np.repeat(positions, n)
                metadata[n] = (cand_rows, cand_pos, engine.state_metadata(runner, cand_rows, cand_pos))
            cand_rows, cand_pos, md = metadata[n]
            out = engine.run_layer(runner, i, cand_rows, cand_pos, states.reshape(r * n, h), md)
            return out.reshape(r, n, h)

        return clasp_dp(layer_fn, x0, engine.num_layers, self.num_skip, self.protected)

    @torch.inference_mode()  # per thread in torch: set here, in the thread
    def run_dp_on_snapshot(self, snapshot: DPSnapshot) -> DPResult:
        """The DP on a snapshot: touches nothing of the engine (background thread)."""
        maybe_fail("clasp.dp")

        def layer_fn(i: int, states: torch.Tensor) -> torch.Tensor:
            with self.gate.background():
                start = time.perf_counter()
                try:
                    return snapshot.layer(i, states)
                finally:  # written by the thread only
                    self.dp_compute_seconds += time.perf_counter() - start

        return clasp_dp(layer_fn, snapshot.x0, self.num_layers, self.num_skip, self.protected)

    def _launch_background(self, runner, engine, requests, picked) -> bool:
        """Snapshot the picked requests and hand them to the thread. False: the
        cache cannot be snapshotted, run on the engine thread from now on."""
        if self.in_flight is not None:
            self.busy_waits += 1  # still running: due again next step
            return True
        self.next_dp_step = self.steps + self.options.layer_optimization_interval
        start = time.perf_counter()
        try:
            if self.snapshots is None:
                self.snapshots = SnapshotTaker(engine.stack, self.options.max_dp_context)
            rows = requests.rows[picked]
            snapshot = self.snapshots.take(runner, rows, requests.last_position[picked] - 1)
        except SnapshotUnsupported as e:
            logger.warning(
                "vllm-layerskip clasp: cannot copy this KV cache for a background DP "
                "(%s); the DP runs on the engine thread instead", e,
            )
            self.updater = None
            return False
        except Exception as e:  # noqa: BLE001 - a DP failure must not stop serving
            self._failed(e, f"snapshot at step {self.steps}")
            return True
        finally:
            elapsed = time.perf_counter() - start
            self.snapshot_seconds += elapsed
            self.budget.charge(elapsed)
        self.snapshot_bytes = snapshot.num_bytes
        self.in_flight = (self.steps, picked.size)
        self.updater.submit(snapshot)
        return True

    def _take_background_result(self) -> None:
        done = self.updater.take()
        if done is None:
            return
        outcome, seconds = done.value, done.seconds
        launched, num_requests = self.in_flight
        self.in_flight = None
        self.dp_seconds += seconds
        if isinstance(outcome, Exception):
            self._failed(
                outcome,
                f"in the background thread (launched at step {launched} on "
                f"{num_requests} requests, seen at step {self.steps})",
            )
            return
        self.delay_steps += self.steps - launched
        self._adopt(outcome, num_requests)

    def _pick(self, requests: DraftRequests) -> np.ndarray:
        """Indices into `requests` of at most max_dp_requests requests, taking
        turns. Position p - 1 must exist (p >= 1 always holds after a sample)."""
        eligible = np.flatnonzero(requests.last_position >= 1)
        limit = self.options.max_dp_requests
        if eligible.size <= limit:
            return eligible
        start = self.rotation % eligible.size
        self.rotation += limit
        return eligible[(start + np.arange(limit)) % eligible.size]

    def _adopt(self, result: DPResult, num_requests: int) -> None:
        self.dp_runs += 1
        self.dp_requests += num_requests
        self.consecutive_failures = 0
        self.last_score = result.score
        self.score_sum += result.score
        old, new = set(self.skipped), set(result.skipped)
        self.jaccard_sum += len(old & new) / len(old | new)
        if new != old:
            self.mask_changes += 1
            # The draft loop reads self.mask once per step: swapping the
            # reference here is the step-boundary switch.
            self.skipped = result.skipped
            self.mask = SkipMask.whole_layers(self.num_layers, self.skipped)
            self.mask_log.append((self.steps, self.skipped))

    def _failed(self, error: Exception, where: str = "on the engine thread") -> None:
        self.failures += 1
        self.consecutive_failures += 1
        self.error = f"{where}: {error!r}"
        logger.error(
            "vllm-layerskip clasp: DP run failed %s (%d in a row); drafting continues "
            "with the last good skip set %s", where, self.consecutive_failures,
            list(self.skipped), exc_info=error,
        )
        if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            self.stopped = True
            logger.error(
                "vllm-layerskip clasp: %d DP failures in a row, no more DP runs; drafting "
                "keeps skip set %s", self.consecutive_failures, list(self.skipped),
            )

    def summary(self) -> dict:
        runs = self.dp_runs
        return {
            "num_skip_layers": self.num_skip,
            "protected_layers": sorted(self.protected),
            "skipped_layers": list(self.skipped),
            "steps": self.steps,
            "dp_runs": runs,
            "dp_deferred": self.deferred,
            "dp_budget_skips": self.budget_skips,
            "dp_requests": self.dp_requests,
            "dp_seconds": self.dp_seconds,
            "dp_seconds_per_run": self.dp_seconds / runs if runs else None,
            "background": self.updater is not None,
            "snapshot_seconds": self.snapshot_seconds,
            "snapshot_seconds_per_run": self.snapshot_seconds / runs if runs and self.snapshots else None,
            "snapshot_bytes": self.snapshot_bytes,
            "dp_busy_waits": self.busy_waits,
            "dp_compute_seconds": self.dp_compute_seconds,
            "engine_gate_waits": self.gate.engine_waits,
            "engine_gate_wait_seconds": self.gate.engine_wait_seconds,
            "mean_mask_delay_steps": self.delay_steps / runs if runs and self.snapshots else None,
            "mask_changes": self.mask_changes,
            "mean_jaccard_to_previous": self.jaccard_sum / runs if runs else None,
            "last_cosine": self.last_score,
            "mean_cosine": self.score_sum / runs if runs else None,
            "failures": self.failures,
            "stopped": self.stopped,
            "error": self.error,
        }
