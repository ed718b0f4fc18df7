"""SWIFT's engine-wide skip-set optimizer: its phases (accumulating,
optimizing, accelerating), what each decoding step does in them, the
termination rules and the warm start (proposer.py says what SWIFT does and how
it differs from the paper).

Its parts: the best set and the duels that replace it (best_set.py), an
optimization step's scoring passes (candidate_scoring.py) on windows of recent
text (scoring_windows.py) through the scoring pass (scoring.py), the optimizer
thread (optimizer_thread.py), the acceptance feedback (acceptance.py) and the
state file (state_file.py)."""

from __future__ import annotations

import logging
import time

import numpy as np

from vllm_layerskip.core.draft_batch import DraftRequests
from vllm_layerskip.core.optimizer_budget import IDLE_SLOWDOWN, OptimizerBudget
from vllm_layerskip.core.rank_agreement import SingleRank
from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
from vllm_layerskip.methods.swift.acceptance import PhaseAcceptance
from vllm_layerskip.methods.swift.best_set import BestSet
from vllm_layerskip.methods.swift.candidate_scoring import CandidateScoring
from vllm_layerskip.methods.swift.optimizer_thread import OptimizerThread
from vllm_layerskip.methods.swift.options import SwiftOptions
from vllm_layerskip.methods.swift.scoring import ScoreWindows
from vllm_layerskip.methods.swift.scoring_windows import WindowPicker, build_windows
from vllm_layerskip.methods.swift.state_file import StateWriter, SwiftState, load_state

logger = logging.getLogger("vllm.layerskip")

# Scoring passes that may fail before optimization is given up.
MAX_SCORE_FAILURES = 3
# What a scoring pass is expected to cost before the first is timed, in engine
# steps: one of SWIFT's 32 scored tokens took 61 ms on SmolLM2, two plain steps.
FIRST_PASS_STEPS = 2


class SwiftOptimizer:
    """The engine-wide skip-set optimizer (phases in the module docstring)."""

    def __init__(self, options: SwiftOptions, num_layers: int, identity, agreement=None):
        self.options = options
        self.identity = identity
        self.space = SubLayerSpace(num_layers)
        self.agreement = agreement or SingleRank()
        self.ratio = options.skip_ratio
        self.count = options.num_skipped(num_layers, self.ratio)
        self.best_set = BestSet(self.space, self.space.evenly_spread(self.count),
                                options.confirm_duels)
        self.phase = "accumulating"
        self.stop_reason = ""
        self.error = ""
        self.decode_steps = 0
        self.opt_steps = 0  # candidates scored in this optimization phase
        self.total_opt_steps = 0
        self.since_improvement = 0
        self.ratio_changes = 0
        self.reoptimizations = 0
        # max_optimizer_share: scoring passes and the thread's CPU time are charged
        # here. Before the first pass is timed, its cost is taken to be that of
        # FIRST_PASS_STEPS engine steps.
        self.budget = OptimizerBudget(options.max_optimizer_share,
                                      first_run_steps=FIRST_PASS_STEPS)
        self.score_failures = 0
        self.windows = WindowPicker(options)
        self.acceptance = PhaseAcceptance()
        self.budget_skips = 0
        self.waited_steps = 0  # steps without an optimization step while self-drafts were off

        state = None
        if options.state_file and self.agreement.is_leader:
            state = load_state(options.state_file, identity)
        # Rank 0's copy: another engine may rewrite the file between two ranks' reads.
        state = self.agreement.share(state)
        # Rank 0 alone runs the optimizer thread and writes the state file; the
        # other ranks take its shared decisions.
        self.thread = OptimizerThread(self.space, options.seed, options.bo_interval,
                                      self.agreement)
        self.worker = self.thread.worker  # its errors, results and counters
        self.state_writer = StateWriter(options.state_file, identity, self.agreement.is_leader,
                                        self.thread)
        self.scoring = CandidateScoring(self.space, self.best_set, self.agreement, self.budget,
                                        self.thread)
        if state is not None:
            self._restore(state)
        self._request_candidate()
        logger.info(
            "vllm-layerskip swift: %s, r=%.2f, %s", self.phase, self.ratio, self.mask.describe()
        )

    # ---- the best set, as the draft loop and the status read it ---------------

    best = property(lambda self: self.best_set.coords)
    mask = property(lambda self: self.best_set.mask)  # read once per step by the draft loop
    best_matchness = property(lambda self: self.best_set.matchness)
    # (decode step, set) of each switch, like ClaspDPScheduler's
    mask_log = property(lambda self: self.best_set.switches)

    # ---- each decoding step ---------------------------------------------------

    def step(self, runner, engine, requests: DraftRequests, learning: bool = True) -> None:
        """`engine`: what scores a set on windows of text (scoring.WindowScorer).
        `learning`: whether self-drafts are in use; while the cost model keeps
        them off, optimization runs at 1/IDLE_SLOWDOWN of its rate and time
        share: the requests gain nothing from it now, but a set that pays can
        still be found."""
        self.decode_steps += 1
        self.budget.step(time.perf_counter(), learning)
        # The thread's CPU time counts against the same share: on a machine
        # whose cores the engine keeps busy, every second it computes is taken
        # from decoding (measured: swift at 0.85x plain at batch 1 with a 0.1
        # cap on scoring alone).
        self.budget.charge(self.thread.uncharged_cpu_seconds(), run=False)
        if self.phase not in ("accumulating", "optimizing"):
            return
        interval = self.options.optimize_interval * (1 if learning else IDLE_SLOWDOWN)
        if self.decode_steps % interval:
            self.waited_steps += not learning
            return
        # A challenger is re-scored only on positions none of its duels scored.
        fresh_from = self.best_set.challenger.fresh_from if self.best_set.challenger else None
        picked = self.windows.pick(runner, requests, fresh_from)
        needed = min(self.options.context_window, self.options.max_score_tokens)
        if sum(length for _, _, length in picked) < needed:
            return
        # Every rank gets here in the same step (the checks above read only
        # data all ranks hold); from here on, rank 0's decision holds.
        decision = self.agreement.share(self._decide() if self.agreement.is_leader else None)
        if decision[0] == "failed":
            self._stop("optimizer thread failed", error=decision[1])
            return
        if self.phase == "accumulating":
            self._set_phase("optimizing")
        if decision[0] == "over budget":
            self.budget_skips += 1
            return
        if decision[0] == "wait":  # still being computed: decoding does not wait
            return
        if decision[0] == "confirm":
            self._guarded_pass(
                runner, build_windows(runner, picked),
                lambda r, w: self._confirm_challenger(r, engine, w),
            )
            if self.best_set.challenger is None and self.phase == "optimizing":
                self._request_candidate()
            return
        candidate = decision[1]
        self.thread.candidate_requested = False
        if len(candidate.coords) != self.count:  # asked for before r was lowered
            self._request_candidate()
            return
        # Built only now: most steps are over budget or waiting for the thread.
        windows = build_windows(runner, picked)
        if not self._guarded_pass(
            runner, windows, lambda r, w: self._score_candidate(r, engine, w, candidate)
        ):
            return
        # Else the next candidate waits for the challenger's verdict, or the
        # optimization phase has just ended.
        if self.best_set.challenger is None and self.phase == "optimizing":
            self._request_candidate()

    def _guarded_pass(self, runner, windows: ScoreWindows, scoring) -> bool:
        """Runs one scoring step; False if it failed so often that optimizing stopped."""
        try:
            scoring(runner, windows)
        except Exception as e:  # noqa: BLE001 - any failure must not stop serving
            self.score_failures += 1
            self.best_set.challenger = None
            logger.exception(
                "vllm-layerskip swift: scoring pass failed (%d/%d) on %d tokens; "
                "drafting continues with the best set %s",
                self.score_failures, MAX_SCORE_FAILURES, windows.num_tokens,
                self.mask.describe(),
            )
            if self.score_failures >= MAX_SCORE_FAILURES:
                self._stop("scoring failed", error=repr(e))
                return False
        return True

    def _decide(self) -> tuple:
        """Rank 0's rank-local decision for a due optimization step."""
        if self.worker.error is not None:
            return ("failed", self.worker.error)
        if not self.budget.allows():
            return ("over budget",)
        if self.best_set.challenger is not None:
            return ("confirm",)
        outcome = self.worker.take()
        return ("wait",) if outcome is None else ("score", outcome.value)

    def _score_candidate(self, runner, engine, windows: ScoreWindows, candidate) -> None:
        improved = self.scoring.candidate(runner, engine, windows, candidate.coords, self.ratio,
                                          self.decode_steps)
        self.opt_steps += 1
        self.total_opt_steps += 1
        if improved is not None:  # None: a challenger waits for confirmation
            self._after_verdict(improved)

    def _confirm_challenger(self, runner, engine, windows: ScoreWindows) -> None:
        improved = self.scoring.confirm(runner, engine, windows, self.ratio, self.decode_steps)
        if improved is not None:
            self._after_verdict(improved)

    def _after_verdict(self, improved: bool) -> None:
        """A candidate was kept or turned down: the termination rules."""
        self.since_improvement = 0 if improved else self.since_improvement + 1
        if self.best_matchness > self.options.target_matchness:
            self._finish_optimizing("target matchness reached")
        elif self.since_improvement >= self.options.patience:
            self._finish_optimizing("patience ran out")
        elif self.opt_steps >= self.options.max_optimization_steps:
            self._finish_optimizing("step limit reached")
        else:
            self._maybe_save()

    def _request_candidate(self) -> None:
        self.thread.request_candidate(self.count, self.total_opt_steps + 1)

    # ---- acceptance feedback --------------------------------------------------

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        self.acceptance.add(drafted, accepted)
        if self.phase != "accelerating" or not self.options.reoptimize_below:
            return
        recent = self.acceptance.fallen_below(self.options.reoptimize_below, drafted, accepted)
        if recent is not None:
            logger.info(
                "vllm-layerskip swift: acceptance fell to %.2f (was %.2f after optimizing); "
                "resuming optimization from the best set", recent, self.acceptance.baseline,
            )
            self.reoptimizations += 1
            self._start_optimizing(reset_score=True)

    # ---- phases ---------------------------------------------------------------

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.acceptance.reset()

    def _start_optimizing(self, reset_score: bool) -> None:
        self.best_set.challenger = None
        self.opt_steps = 0
        self.since_improvement = 0
        if reset_score:  # re-measured on the new text
            self.best_set.forget_scores()
        self._set_phase("optimizing")
        self._request_candidate()

    def _finish_optimizing(self, reason: str) -> None:
        acceptance = self.acceptance.rate
        low = (
            acceptance is not None
            and self.acceptance.measured
            and acceptance < self.options.acceptance_tolerance
            and reason != "target matchness reached"
        )
        new_ratio = round(self.ratio - self.options.skip_ratio_step, 6)
        new_count = self.options.num_skipped(self.space.num_layers, new_ratio)
        if low and self.options.skip_ratio_step > 0 and 1 <= new_count < self.count:
            logger.info(
                "vllm-layerskip swift: %s with acceptance %.2f < %.2f: lowering r %.2f -> %.2f",
                reason, acceptance, self.options.acceptance_tolerance, self.ratio, new_ratio,
            )
            rng = np.random.default_rng(self.options.seed + self.ratio_changes + 1)
            subset = tuple(sorted(int(c) for c in rng.choice(self.best, new_count, replace=False)))
            self.ratio, self.count = new_ratio, new_count
            self.ratio_changes += 1
            self.best_set.replace(subset, [], self.decode_steps)
            self._start_optimizing(reset_score=True)
            self._maybe_save(force=True)
            return
        self.stop_reason = reason
        self._set_phase("accelerating")
        logger.info(
            "vllm-layerskip swift: optimization done (%s) after %d steps: matchness %.3f, r=%.2f, %s",
            reason, self.opt_steps, self.best_matchness, self.ratio, self.mask.describe(),
        )
        self._maybe_save(force=True)

    def _stop(self, reason: str, error: str) -> None:
        self.stop_reason = reason
        self.error = error
        self._set_phase("stopped")
        logger.error(
            "vllm-layerskip swift: optimization stopped (%s: %s); drafting continues "
            "with the last good set %s", reason, error, self.mask.describe(),
        )

    # ---- warm start -----------------------------------------------------------

    def _restore(self, state: SwiftState) -> None:
        self.ratio = state.skip_ratio
        self.count = self.options.num_skipped(self.space.num_layers, self.ratio)
        best = self.space.coords(state.best_attn, state.best_mlp)
        self.best_set.replace(best, [state.best_matchness], self.decode_steps)
        self.best_set.improvements = 0
        self.scoring.history = list(state.history)
        for o in state.history:
            self.thread.observe(self.space.coords(o.skip_attn, o.skip_mlp), o.matchness)
        if state.optimization_finished:
            self.stop_reason = "loaded from state_file"
            self._set_phase("accelerating")
        logger.info(
            "vllm-layerskip swift: warm start from %s (%d observations, matchness %.3f)",
            self.options.state_file, len(state.history), state.best_matchness,
        )

    def _maybe_save(self, force: bool = False) -> None:
        self.state_writer.maybe_save(self.space.layer_sets(self.best), self.ratio,
                                     self.best_matchness, self.phase == "accelerating",
                                     self.scoring.history, force=force)

    def summary(self) -> dict:
        scoring = self.scoring
        return {
            "phase": self.phase,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "skip_ratio": self.ratio,
            "num_skipped": self.count,
            "best_matchness": self.best_matchness,
            "initial_matchness": (
                float(np.mean(scoring.initial_matchness)) if scoring.initial_matchness else None
            ),
            "initial_set": self.space.layer_sets(scoring.initial),
            "best_set": self.space.layer_sets(self.best),
            "optimization_steps": self.total_opt_steps,
            "improvements": self.best_set.improvements,
            "challengers": self.best_set.challengers,
            "challengers_rejected": self.best_set.challengers_rejected,
            "ratio_changes": self.ratio_changes,
            "reoptimizations": self.reoptimizations,
            "score_passes": scoring.score_passes,
            "score_tokens": scoring.score_tokens,
            "score_seconds": scoring.score_seconds,
            "busy_seconds": self.budget.busy_seconds,
            "budget_skips": self.budget_skips,
            "waited_steps": self.waited_steps,
            "worker_seconds": self.worker.busy_seconds,
            "worker_cpu_seconds": self.worker.cpu_seconds,
            "bayes_suggestions": self.thread.jobs.num_bayes,
            "random_suggestions": self.thread.jobs.num_random,
            "phase_acceptance": self.acceptance.rate,
            "mask_switch_steps": [step for step, _ in self.best_set.switches],
        }
