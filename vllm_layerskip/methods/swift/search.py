"""SWIFT's engine-wide skip-set optimizer: its phases (accumulating,
optimizing, accelerating), candidate scoring by matchness, acceptance feedback,
and the background thread that runs the Gaussian process (proposer.py says
what SWIFT does and how it differs from the paper)."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from vllm_layerskip.core.background_worker import BackgroundWorker
from vllm_layerskip.core.draft_engine import DraftRequests
from vllm_layerskip.core.faults import maybe_delay, maybe_fail
from vllm_layerskip.core.optimizer_budget import OptimizerBudget
from vllm_layerskip.core.rank_agreement import SingleRank
from vllm_layerskip.core.set_search import BayesianSetOptimizer, Coords, SubLayerSpace
from vllm_layerskip.core.versioned_file import SHIPPED
from vllm_layerskip.methods.swift.options import SwiftOptions
from vllm_layerskip.methods.swift.state_file import Observation, SwiftState, load_state, save_state
from vllm_layerskip.methods.swift.scoring import ScoreWindows

logger = logging.getLogger("vllm.layerskip")

# Acceptance needs this many verified draft tokens before it decides anything.
MIN_ACCEPTANCE_TOKENS = 64
# The best set is re-scored beside at least every this-many-th candidate, so
# that the mean that candidates must beat follows the text (+10% scoring cost
# at one candidate a step).
RESCORE_BEST_EVERY = 10
# Scoring passes that may fail before optimization is given up.
MAX_SCORE_FAILURES = 3
SAVE_INTERVAL_S = 5.0


@dataclass
class _Candidate:
    coords: Coords
    source: str  # "bayes" | "random"


@dataclass
class _Challenger:
    """A candidate that beat the best set in one duel and must beat it again
    on `confirm_duels` later windows before it replaces it."""

    coords: Coords
    scores: list[float]  # its matchness in each duel it won
    # request id -> first position no duel of this challenger has scored yet
    fresh_from: dict[str, int]

    def mark_scored(self, runner, windows: ScoreWindows) -> None:
        req_ids = runner.input_batch.req_ids
        for row, start, length in zip(windows.rows, windows.starts, windows.lengths):
            req_id = req_ids[int(row)]
            self.fresh_from[req_id] = max(self.fresh_from.get(req_id, 0), int(start + length))


class SwiftSearch:
    """The engine-wide skip-set optimizer (phases in the module docstring)."""

    def __init__(self, options: SwiftOptions, num_layers: int, identity, agreement=None):
        self.options = options
        self.identity = identity
        self.space = SubLayerSpace(num_layers)
        self.agreement = agreement or SingleRank()
        # Only rank 0 optimizes and writes the state file; the other ranks
        # apply its shared decisions.
        # The shipped state is read only: SWIFT goes on from it in memory.
        self.write_state = self.agreement.is_leader and options.state_file != SHIPPED
        self.ratio = options.skip_ratio
        self.count = options.num_skipped(num_layers, self.ratio)
        self.best: Coords = self.space.evenly_spread(self.count)
        # The best set's matchness: its mean over every window it was scored
        # on since it became the best set (-1: not measured yet). A candidate
        # is duelled if it scores above that, or if the best set was last scored
        # RESCORE_BEST_EVERY candidates ago. The best set's score on its last
        # window alone, the gate before, let one easy window (0.75 against a
        # mean of 0.64 on Qwen2.5-Coder-1.5B) turn every candidate away for the
        # next 50 and more (benchmarks/results/2026-11-26/
        # learn_swift_set_confirm2_lastwindow_gate_stopped.log).
        self._forget_best_scores()
        self.candidates_since_best_scored = 0
        self.candidate_requested = False  # asked for and not taken yet
        self.initial = self.best
        self.initial_matchness: list[float] = []  # scores of the initial set
        self.mask = self.space.mask(self.best)
        self.phase = "accumulating"
        self.stop_reason = ""
        self.error = ""
        self.history: list[Observation] = []
        self.decode_steps = 0
        self.opt_steps = 0  # candidates scored in this optimization phase
        self.total_opt_steps = 0
        self.since_improvement = 0
        self.improvements = 0
        self.challenger: _Challenger | None = None
        self.challengers = 0  # candidates that won a first duel
        self.challengers_rejected = 0  # ... and then lost a confirming one
        self.ratio_changes = 0
        self.reoptimizations = 0
        self.score_passes = 0
        self.score_tokens = 0
        self.score_seconds = 0.0
        # max_optimizer_share: scoring passes and the thread's CPU time are charged here.
        self.budget = OptimizerBudget(options.max_optimizer_share)
        self.score_failures = 0
        self.window_rotation = 0
        self.phase_drafted = self.phase_accepted = 0
        self.baseline_acceptance: float | None = None
        self.recent = deque()  # (drafted, accepted) of the last verify steps
        self.last_save = 0.0
        self.budget_skips = 0
        self.charged_worker_cpu = 0.0  # optimizer-thread CPU seconds already charged
        self.mask_log: list[tuple[int, Coords]] = []  # (decode step, set) of each switch

        state = None
        if options.state_file and self.agreement.is_leader:
            state = load_state(options.state_file, identity)
        # Rank 0's copy: another engine may rewrite the file between two ranks' reads.
        state = self.agreement.share(state)
        # Rank 0 alone runs the optimizer thread; the other ranks take its
        # shared decisions.
        self.jobs = _OptimizerJobs(self.space, options.seed, rank=self.agreement.rank)
        self.worker = BackgroundWorker(
            self.jobs.run, "layerskip-swift-optimizer", stop_on_error=True,
            enabled=self.agreement.is_leader,
        )
        if state is not None:
            self._restore(state)
        self._request_candidate()
        logger.info(
            "vllm-layerskip swift: %s, r=%.2f, %s", self.phase, self.ratio, self.mask.describe()
        )

    # ---- each decoding step ---------------------------------------------------

    def step(self, runner, engine, requests: DraftRequests) -> None:
        """`engine`: what scores a set on windows of text (scoring.WindowScorer)."""
        self.decode_steps += 1
        self.budget.step(time.perf_counter())
        # The thread's CPU time counts against the same share: on a machine
        # whose cores the engine keeps busy, every second it computes is taken
        # from decoding (measured: swift at 0.85x plain at batch 1 with a 0.1
        # cap on scoring alone).
        worker_cpu = self.worker.cpu_seconds
        self.budget.charge(worker_cpu - self.charged_worker_cpu)
        self.charged_worker_cpu = worker_cpu
        if self.phase not in ("accumulating", "optimizing"):
            return
        if self.decode_steps % self.options.optimize_interval:
            return
        # A challenger is re-scored only on positions none of its duels scored.
        fresh_from = self.challenger.fresh_from if self.challenger else None
        picked = self._pick_windows(runner, requests, fresh_from)
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
                runner, self._windows(runner, picked),
                lambda r, w: self._confirm_challenger(r, engine, w),
            )
            if self.challenger is None and self.phase == "optimizing":
                self._request_candidate()
            return
        candidate = decision[1]
        self.candidate_requested = False
        if len(candidate.coords) != self.count:  # asked for before r was lowered
            self._request_candidate()
            return
        # Built only now: most steps are over budget or waiting for the thread.
        windows = self._windows(runner, picked)
        if not self._guarded_pass(
            runner, windows, lambda r, w: self._score_candidate(r, engine, w, candidate)
        ):
            return
        # Else the next candidate waits for the challenger's verdict, or the
        # optimization phase has just ended.
        if self.challenger is None and self.phase == "optimizing":
            self._request_candidate()

    def _guarded_pass(self, runner, windows: ScoreWindows, scoring) -> bool:
        """Runs one scoring step; False if it failed so often that optimizing stopped."""
        try:
            scoring(runner, windows)
        except Exception as e:  # noqa: BLE001 - any failure must not stop serving
            self.score_failures += 1
            self.challenger = None
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
        if self.challenger is not None:
            return ("confirm",)
        outcome = self.worker.take()
        return ("wait",) if outcome is None else ("score", outcome.value)

    def _matchness(self, runner, engine, windows: ScoreWindows, coords: Coords) -> float:
        score = float(engine.score(runner, windows, self.space.mask(coords)).mean())
        # Equal on every rank in theory (same logits); shared so that what
        # follows from it (the incumbent pass, the best set) surely is.
        return self.agreement.share(score)

    def _score_candidate(self, runner, engine, windows: ScoreWindows, candidate: _Candidate) -> None:
        maybe_fail("swift.score")
        start = time.perf_counter()
        score = self._matchness(runner, engine, windows, candidate.coords)
        observed = [(candidate.coords, score)]
        improved = None  # None: undecided, a challenger waits for confirmation
        self.candidates_since_best_scored += 1
        duel = (score > self.best_matchness
                or self.candidates_since_best_scored >= RESCORE_BEST_EVERY)
        if duel and candidate.coords != self.best:
            incumbent = self._matchness(runner, engine, windows, self.best)
            observed.append((self.best, incumbent))
            if score <= incumbent:
                self._score_best(incumbent)
                improved = False
            elif self.options.confirm_duels == 0:
                self._set_best(candidate.coords, [score])
                improved = True
            else:
                self.challenger = _Challenger(candidate.coords, [score], {})
                self.challenger.mark_scored(runner, windows)
                self.challengers += 1
        else:
            if candidate.coords == self.best:
                self._score_best(score)
            improved = False
        self._record(windows, observed, time.perf_counter() - start)
        self.opt_steps += 1
        self.total_opt_steps += 1
        if improved is not None:
            self._after_verdict(improved)

    def _confirm_challenger(self, runner, engine, windows: ScoreWindows) -> None:
        """Another duel of the challenger with the best set, on fresh positions."""
        maybe_fail("swift.score")
        start = time.perf_counter()
        challenger = self.challenger
        score = self._matchness(runner, engine, windows, challenger.coords)
        incumbent = self._matchness(runner, engine, windows, self.best)
        challenger.mark_scored(runner, windows)
        self._record(windows, [(challenger.coords, score), (self.best, incumbent)],
                     time.perf_counter() - start)
        if score <= incumbent:
            self.challenger = None
            self.challengers_rejected += 1
            self._score_best(incumbent)
            self._after_verdict(improved=False)
            return
        challenger.scores.append(score)
        if len(challenger.scores) > self.options.confirm_duels:
            self.challenger = None
            self._set_best(challenger.coords, challenger.scores)
            self._after_verdict(improved=True)

    def _record(self, windows: ScoreWindows, observed: list[tuple[Coords, float]], elapsed: float) -> None:
        """Counts and charges a step's scoring passes and hands their scores to
        the Gaussian process and the history."""
        self.score_passes += len(observed)
        self.score_tokens += len(observed) * windows.num_tokens
        self.score_seconds += elapsed
        self.budget.charge(elapsed)
        for coords, s in observed:
            if coords == self.initial:
                self.initial_matchness.append(s)
            if not np.isfinite(s):
                raise ValueError(f"non-finite matchness {s!r}")
            self.worker.submit(("observe", coords, s))
            self.history.append(Observation(**self.space.layer_sets(coords), skip_ratio=self.ratio, matchness=s))

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
        """Asks the thread for the next candidate, unless one is already on its way."""
        if self.candidate_requested:
            return
        self.candidate_requested = True
        use_bo = (self.total_opt_steps + 1) % self.options.bo_interval == 0
        self.worker.submit(("suggest", self.count, "bayes" if use_bo else "random"))

    # ---- acceptance feedback --------------------------------------------------

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        self.phase_drafted += drafted
        self.phase_accepted += accepted
        if self.phase != "accelerating" or not self.options.reoptimize_below:
            return
        if self.baseline_acceptance is None:
            if self.phase_drafted >= MIN_ACCEPTANCE_TOKENS:
                self.baseline_acceptance = self.phase_accepted / self.phase_drafted
            return
        self.recent.append((drafted, accepted))
        while sum(d for d, _ in self.recent) - self.recent[0][0] >= MIN_ACCEPTANCE_TOKENS:
            self.recent.popleft()
        recent_drafted = sum(d for d, _ in self.recent)
        if recent_drafted < MIN_ACCEPTANCE_TOKENS:
            return
        recent = sum(a for _, a in self.recent) / recent_drafted
        if recent < self.options.reoptimize_below * self.baseline_acceptance:
            logger.info(
                "vllm-layerskip swift: acceptance fell to %.2f (was %.2f after optimizing); "
                "resuming optimization from the best set", recent, self.baseline_acceptance,
            )
            self.reoptimizations += 1
            self._start_optimizing(reset_score=True)

    # ---- phases ---------------------------------------------------------------

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_drafted = self.phase_accepted = 0
        self.baseline_acceptance = None
        self.recent.clear()

    def _start_optimizing(self, reset_score: bool) -> None:
        self.challenger = None
        self.opt_steps = 0
        self.since_improvement = 0
        if reset_score:  # re-measured on the new text
            self._forget_best_scores()
        self._set_phase("optimizing")
        self._request_candidate()

    def _finish_optimizing(self, reason: str) -> None:
        acceptance = self.phase_accepted / self.phase_drafted if self.phase_drafted else None
        low = (
            acceptance is not None
            and self.phase_drafted >= MIN_ACCEPTANCE_TOKENS
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
            self._set_best(subset, [])
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

    def _set_best(self, coords: Coords, scores: list[float]) -> None:
        """Drafts with `coords` from the next step on; `scores`: its matchness
        on the windows it was scored on so far."""
        self.best = coords
        self._forget_best_scores()
        for score in scores:
            self._score_best(score)
        # The draft loop reads self.mask once per step: swapping the reference
        # is the step-boundary switch.
        self.mask = self.space.mask(coords)
        self.improvements += 1
        self.mask_log.append((self.decode_steps, coords))

    @property
    def best_matchness(self) -> float:
        """The best set's mean matchness over the windows it was scored on; -1
        before the first."""
        return self.best_score_sum / self.best_score_count if self.best_score_count else -1.0

    def _forget_best_scores(self) -> None:
        self.best_score_sum, self.best_score_count = 0.0, 0

    def _score_best(self, score: float) -> None:
        self.candidates_since_best_scored = 0
        self.best_score_sum += score
        self.best_score_count += 1

    # ---- scoring windows ------------------------------------------------------

    def _pick_windows(
        self, runner, requests: DraftRequests, fresh_from: dict[str, int] | None = None
    ) -> list[tuple[int, int, int]]:
        """(row, start, length) of the most recent generated tokens of the
        running requests, up to gamma per request and max_score_tokens in all;
        requests take turns being first so every stream is scored over time.
        With `fresh_from` (request id -> position), a request's window starts
        no earlier than its position there."""
        n = len(requests.rows)
        if n == 0:
            return []
        batch = runner.input_batch
        order = np.roll(np.arange(n), -(self.window_rotation % n))
        self.window_rotation += 1
        budget = self.options.max_score_tokens
        picked = []
        for i in order:
            row, p = int(requests.rows[i]), int(requests.last_position[i])
            # Targets must be generated tokens (positions >= num_prompt_tokens).
            first = max(p - self.options.context_window, int(batch.num_prompt_tokens[row]) - 1, 0)
            if fresh_from is not None:
                first = max(first, fresh_from.get(batch.req_ids[row], 0))
            length = min(p - first, budget)
            if length < 1:
                continue
            picked.append((row, p - length, length))
            budget -= length
            if budget == 0:
                break
        return picked

    @staticmethod
    def _windows(runner, picked: list[tuple[int, int, int]]) -> ScoreWindows:
        # Short queries first: some attention backends want decode-like
        # requests before longer ones.
        picked = sorted(picked, key=lambda w: w[2])
        tokens = runner.input_batch.token_ids_cpu
        return ScoreWindows(
            rows=np.array([w[0] for w in picked], dtype=np.int64),
            starts=np.array([w[1] for w in picked], dtype=np.int64),
            lengths=np.array([w[2] for w in picked], dtype=np.int64),
            input_ids=np.concatenate([tokens[r, s : s + n] for r, s, n in picked]).astype(np.int64),
            targets=np.concatenate([tokens[r, s + 1 : s + n + 1] for r, s, n in picked]).astype(np.int64),
        )

    # ---- warm start -----------------------------------------------------------

    def _restore(self, state: SwiftState) -> None:
        self.ratio = state.skip_ratio
        self.count = self.options.num_skipped(self.space.num_layers, self.ratio)
        best = self.space.coords(state.best_attn, state.best_mlp)
        self._set_best(best, [state.best_matchness])
        self.improvements = 0
        self.history = list(state.history)
        for o in state.history:
            self.worker.submit(("observe", self.space.coords(o.skip_attn, o.skip_mlp), o.matchness))
        if state.optimization_finished:
            self.stop_reason = "loaded from state_file"
            self._set_phase("accelerating")
        logger.info(
            "vllm-layerskip swift: warm start from %s (%d observations, matchness %.3f)",
            self.options.state_file, len(state.history), state.best_matchness,
        )

    def _maybe_save(self, force: bool = False) -> None:
        if not (self.options.state_file and self.write_state):
            return
        now = time.monotonic()
        if not force and now - self.last_save < SAVE_INTERVAL_S:
            return
        self.last_save = now
        sets = self.space.layer_sets(self.best)
        state = SwiftState(
            model=self.identity,
            skip_ratio=self.ratio,
            best_attn=sets["skip_attn"],
            best_mlp=sets["skip_mlp"],
            best_matchness=max(self.best_matchness, 0.0),
            optimization_finished=self.phase == "accelerating",
            history=list(self.history),
        )
        self.worker.submit(("save", self.options.state_file, state))

    def summary(self) -> dict:
        acceptance = self.phase_accepted / self.phase_drafted if self.phase_drafted else None
        return {
            "phase": self.phase,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "skip_ratio": self.ratio,
            "num_skipped": self.count,
            "best_matchness": self.best_matchness,
            "initial_matchness": (
                float(np.mean(self.initial_matchness)) if self.initial_matchness else None
            ),
            "initial_set": self.space.layer_sets(self.initial),
            "best_set": self.space.layer_sets(self.best),
            "optimization_steps": self.total_opt_steps,
            "improvements": self.improvements,
            "challengers": self.challengers,
            "challengers_rejected": self.challengers_rejected,
            "ratio_changes": self.ratio_changes,
            "reoptimizations": self.reoptimizations,
            "score_passes": self.score_passes,
            "score_tokens": self.score_tokens,
            "score_seconds": self.score_seconds,
            "busy_seconds": self.budget.busy_seconds,
            "budget_skips": self.budget_skips,
            "worker_seconds": self.worker.busy_seconds,
            "worker_cpu_seconds": self.worker.cpu_seconds,
            "bayes_suggestions": self.jobs.num_bayes,
            "random_suggestions": self.jobs.num_random,
            "phase_acceptance": acceptance,
            "mask_switch_steps": [step for step, _ in self.mask_log],
        }


class _OptimizerJobs:
    """What the optimizer's background thread does, in order of the requests, so
    that a suggestion always sees every earlier score: register a score with the
    Gaussian process, compute the next candidate, write the state file."""

    def __init__(self, space: SubLayerSpace, seed: int, rank: int = 0):
        self.space = space
        self.rank = rank  # tensor-parallel rank, for fault injection
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.bo: BayesianSetOptimizer | None = None
        self.num_bayes = self.num_random = 0
        self.save_failed = False

    def run(self, job: tuple) -> _Candidate | None:
        maybe_fail("swift.optimizer")
        maybe_delay("swift.optimizer", self.rank)
        if job[0] == "observe":
            self._optimizer().register(job[1], job[2])
        elif job[0] == "suggest":
            return self._suggest(job[1], job[2])
        elif job[0] == "save":
            self._save(job[1], job[2])
        return None

    def _save(self, path: str, state: SwiftState) -> None:
        try:
            save_state(path, state)
        except OSError as e:  # a full disk must not stop the optimizer
            if not self.save_failed:
                logger.error("vllm-layerskip swift: cannot write state_file %s: %s", path, e)
            self.save_failed = True

    def _optimizer(self) -> BayesianSetOptimizer:
        if self.bo is None:  # built lazily: the import and GP setup take time
            self.bo = BayesianSetOptimizer(self.space, self.seed)
        return self.bo

    def _suggest(self, count: int, source: str) -> _Candidate:
        if source == "bayes" and self._optimizer().num_observations:
            self.num_bayes += 1
            return _Candidate(self._optimizer().suggest(count), "bayes")
        self.num_random += 1
        return _Candidate(self.space.random(self.rng, count), "random")
