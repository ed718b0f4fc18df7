"""When CLaSp's DP runs, on which requests, and what is kept when it fails
(proposer.py says what CLaSp does and why)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from vllm_layerskip.core.draft_batch import DraftRequests
from vllm_layerskip.core.faults import maybe_fail
from vllm_layerskip.core.optimizer_budget import OptimizerBudget
from vllm_layerskip.core.rank_agreement import SingleRank
from vllm_layerskip.core.skip_mask import SkipMask
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


class ClaspDPScheduler:
    """When the DP runs, on which requests, and what is kept when it fails."""

    def __init__(self, options: ClaspOptions, num_layers: int, agreement=None):
        self.options = options
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
        # max_optimizer_share: DP runs are charged here; a due run waits while
        # it is overdrawn.
        self.budget = OptimizerBudget(options.max_optimizer_share)
        self.budget_skips = 0
        self.score_sum = 0.0
        self.last_score: float | None = None
        self.jaccard_sum = 0.0  # similarity of consecutive skip sets (paper Fig. 3a)
        self.mask_log: list[tuple[int, tuple[int, ...]]] = []  # (step, set) of each switch
        logger.info(
            "vllm-layerskip clasp: M=%d of %d layers, DP every %d steps, first mask %s",
            self.num_skip, num_layers, options.layer_optimization_interval, list(self.skipped),
        )

    def step(self, runner, engine, requests: DraftRequests, drafting: bool = True,
             learning: bool = True) -> None:
        """`drafting`: whether this step is expected to draft (a due run waits
        otherwise); `learning`: whether self-drafts are in use (the budget
        earns 1/IDLE_SLOWDOWN of the share otherwise: after each probe of a
        cost model that keeps self-drafts off, a due run is allowed only as
        that smaller share allows)."""
        self.steps += 1
        self.budget.step(time.perf_counter(), learning)
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

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        self.consecutive_failures += 1
        self.error = repr(error)
        logger.error(
            "vllm-layerskip clasp: DP run failed (%d in a row); drafting continues "
            "with the last good skip set %s", self.consecutive_failures,
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
            "mask_changes": self.mask_changes,
            "mean_jaccard_to_previous": self.jaccard_sum / runs if runs else None,
            "last_cosine": self.last_score,
            "mean_cosine": self.score_sum / runs if runs else None,
            "failures": self.failures,
            "stopped": self.stopped,
            "error": self.error,
        }
