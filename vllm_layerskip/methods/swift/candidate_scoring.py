"""The scoring passes of one SWIFT optimization step: a candidate's matchness
on windows of recent text, its duel with the best set on the same windows
(best_set.py), and what the passes cost and found: their count and time,
charged to the optimizer's budget, and every score, handed to the Gaussian
process and the history."""

from __future__ import annotations

import time

import numpy as np

from vllm_layerskip.core.faults import maybe_fail
from vllm_layerskip.core.skip_set_optimizer import Coords, SubLayerSpace
from vllm_layerskip.methods.swift.best_set import BestSet
from vllm_layerskip.methods.swift.optimizer_thread import OptimizerThread
from vllm_layerskip.methods.swift.scoring import ScoreWindows
from vllm_layerskip.methods.swift.state_file import Observation


class CandidateScoring:
    def __init__(self, space: SubLayerSpace, best_set: BestSet, agreement, budget,
                 thread: OptimizerThread):
        self.space = space
        self.best_set = best_set
        self.agreement = agreement
        self.budget = budget  # OptimizerBudget: each step's scoring time is charged
        self.thread = thread  # each score is registered with its Gaussian process
        self.initial = best_set.coords
        self.initial_matchness: list[float] = []  # scores of the initial set
        self.history: list[Observation] = []
        self.score_passes = 0
        self.score_tokens = 0
        self.score_seconds = 0.0

    def candidate(self, runner, engine, windows: ScoreWindows, coords: Coords,
                  ratio: float, step: int) -> bool | None:
        """Scores a candidate and duels it with the best set if it may win:
        True (it replaced the best set), False (turned down) or None (a
        challenger waits for confirmation)."""
        maybe_fail("swift.score")
        start = time.perf_counter()
        score = self._matchness(runner, engine, windows, coords)
        observed, improved = self.best_set.duel(
            coords, score, lambda c: self._matchness(runner, engine, windows, c),
            runner.input_batch.req_ids, windows, step,
        )
        self._record(windows, observed, ratio, time.perf_counter() - start)
        return improved

    def confirm(self, runner, engine, windows: ScoreWindows, ratio: float,
                step: int) -> bool | None:
        """Another duel of the challenger with the best set, on fresh positions;
        the verdict as `candidate` gives it."""
        maybe_fail("swift.score")
        start = time.perf_counter()
        challenger, best = self.best_set.challenger, self.best_set.coords
        score = self._matchness(runner, engine, windows, challenger.coords)
        incumbent = self._matchness(runner, engine, windows, best)
        challenger.mark_scored(runner.input_batch.req_ids, windows)
        self._record(windows, [(challenger.coords, score), (best, incumbent)], ratio,
                     time.perf_counter() - start)
        return self.best_set.confirm(score, incumbent, step)

    def _matchness(self, runner, engine, windows: ScoreWindows, coords: Coords) -> float:
        score = float(engine.score(runner, windows, self.space.mask(coords)).mean())
        # Equal on every rank in theory (same logits); shared so that what
        # follows from it (the incumbent pass, the best set) surely is.
        return self.agreement.share(score)

    def _record(self, windows: ScoreWindows, observed: list[tuple[Coords, float]], ratio: float,
                elapsed: float) -> None:
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
            self.thread.observe(coords, s)
            self.history.append(Observation(**self.space.layer_sets(coords), skip_ratio=ratio,
                                            matchness=s))
