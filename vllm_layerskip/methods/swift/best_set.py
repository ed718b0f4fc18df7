"""SWIFT's best set: the skip set it drafts with, its matchness since it became
the best set, and the duels a scored candidate must win to replace it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from vllm_layerskip.core.skip_set_optimizer import Coords, SubLayerSpace
from vllm_layerskip.methods.swift.scoring import ScoreWindows

# The best set is re-scored beside at least every this-many-th candidate, so
# that the mean that candidates must beat follows the text (+10% scoring cost
# at one candidate a step).
RESCORE_BEST_EVERY = 10


@dataclass
class Challenger:
    """A candidate that beat the best set in one duel and must beat it again
    on `confirm_duels` later windows before it replaces it."""

    coords: Coords
    scores: list[float]  # its matchness in each duel it won
    # request id -> first position no duel of this challenger has scored yet
    fresh_from: dict[str, int]

    def mark_scored(self, req_ids: Sequence[str], windows: ScoreWindows) -> None:
        for row, start, length in zip(windows.rows, windows.starts, windows.lengths):
            req_id = req_ids[int(row)]
            self.fresh_from[req_id] = max(self.fresh_from.get(req_id, 0), int(start + length))


class BestSet:
    """The set drafted with and how candidates are judged against it.

    `matchness`: its mean over every window it was scored on since it became
    the best set (-1: not measured yet). A candidate is duelled if it scores
    above that, or if the best set was last scored RESCORE_BEST_EVERY
    candidates ago. The best set's score on its last window alone, the gate
    before, let one easy window (0.75 against a mean of 0.64 on
    Qwen2.5-Coder-1.5B) turn every candidate away for the next 50 and more
    (benchmarks/results/2026-11-26/learn_swift_set_confirm2_lastwindow_gate_stopped.log).
    """

    def __init__(self, space: SubLayerSpace, coords: Coords, confirm_duels: int):
        self.space = space
        self.confirm_duels = confirm_duels
        self.coords = coords
        self.mask = space.mask(coords)
        self.forget_scores()
        self.candidates_since_scored = 0
        self.challenger: Challenger | None = None
        self.challengers = 0  # candidates that won a first duel
        self.challengers_rejected = 0  # ... and then lost a confirming one
        self.improvements = 0
        self.switches: list[tuple[int, Coords]] = []  # (decode step, set) of each switch

    @property
    def matchness(self) -> float:
        """The mean matchness over the windows it was scored on; -1 before the first."""
        return self.score_sum / self.score_count if self.score_count else -1.0

    def forget_scores(self) -> None:
        self.score_sum, self.score_count = 0.0, 0

    def add_score(self, score: float) -> None:
        self.candidates_since_scored = 0
        self.score_sum += score
        self.score_count += 1

    def replace(self, coords: Coords, scores: list[float], step: int) -> None:
        """Drafts with `coords` from the next step on; `scores`: its matchness
        on the windows it was scored on so far."""
        self.coords = coords
        self.forget_scores()
        for score in scores:
            self.add_score(score)
        # The draft loop reads the mask once per step: swapping the reference
        # is the step-boundary switch.
        self.mask = self.space.mask(coords)
        self.improvements += 1
        self.switches.append((step, coords))

    def duel(self, coords: Coords, score: float, matchness: Callable[[Coords], float],
             req_ids: Sequence[str], windows: ScoreWindows, step: int):
        """A candidate scored `score` on `windows`; `matchness` scores a set on
        the same windows. Returns the scores observed, (set, score) each, and
        the verdict: True (it replaced the best set), False (turned down) or
        None (a challenger waits for confirmation)."""
        observed = [(coords, score)]
        self.candidates_since_scored += 1
        due = score > self.matchness or self.candidates_since_scored >= RESCORE_BEST_EVERY
        if not due or coords == self.coords:
            if coords == self.coords:
                self.add_score(score)
            return observed, False
        incumbent = matchness(self.coords)
        observed.append((self.coords, incumbent))
        if score <= incumbent:
            self.add_score(incumbent)
            return observed, False
        if self.confirm_duels == 0:
            self.replace(coords, [score], step)
            return observed, True
        self.challenger = Challenger(coords, [score], {})
        self.challenger.mark_scored(req_ids, windows)
        self.challengers += 1
        return observed, None

    def confirm(self, score: float, incumbent: float, step: int) -> bool | None:
        """The challenger scored `score` in another duel, on fresh positions,
        and the best set `incumbent`: the verdict, as `duel` gives it."""
        challenger = self.challenger
        if score <= incumbent:
            self.challenger = None
            self.challengers_rejected += 1
            self.add_score(incumbent)
            return False
        challenger.scores.append(score)
        if len(challenger.scores) > self.confirm_duels:
            self.challenger = None
            self.replace(challenger.coords, challenger.scores, step)
            return True
        return None
