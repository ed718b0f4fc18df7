"""SWIFT's optimizer thread (core/background_worker.py), off the decoding path:
what the engine thread asks of it and what it does: register scores with the
Gaussian process, compute the next candidate (Bayesian or random), write the
state file. Rank 0 alone runs it; the other ranks take its shared decisions."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from vllm_layerskip.core.background_worker import BackgroundWorker
from vllm_layerskip.core.faults import maybe_delay, maybe_fail
from vllm_layerskip.core.skip_set_optimizer import BayesianSetOptimizer, Coords, SubLayerSpace
from vllm_layerskip.methods.swift.state_file import SwiftState, save_state

logger = logging.getLogger("vllm.layerskip")


@dataclass
class Candidate:
    coords: Coords
    source: str  # "bayes" | "random"


class OptimizerJobs:
    """The thread's jobs, in order of the requests, so that a suggestion always
    sees every earlier score: ("observe", coords, matchness), ("suggest", count,
    "bayes" | "random") -> Candidate, ("save", path, SwiftState)."""

    def __init__(self, space: SubLayerSpace, seed: int, rank: int = 0):
        self.space = space
        self.rank = rank  # tensor-parallel rank, for fault injection
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.bo: BayesianSetOptimizer | None = None
        self.num_bayes = self.num_random = 0
        self.save_failed = False

    def run(self, job: tuple) -> Candidate | None:
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

    def _suggest(self, count: int, source: str) -> Candidate:
        if source == "bayes" and self._optimizer().num_observations:
            self.num_bayes += 1
            return Candidate(self._optimizer().suggest(count), "bayes")
        self.num_random += 1
        return Candidate(self.space.random(self.rng, count), "random")


class OptimizerThread:
    """The thread and the engine thread's requests to it, in order."""

    def __init__(self, space: SubLayerSpace, seed: int, bo_interval: int, agreement):
        self.bo_interval = bo_interval
        self.jobs = OptimizerJobs(space, seed, rank=agreement.rank)
        self.worker = BackgroundWorker(
            self.jobs.run, "layerskip-swift-optimizer", stop_on_error=True,
            enabled=agreement.is_leader,
        )
        self.candidate_requested = False  # asked for and not taken yet
        self.charged_cpu = 0.0  # its CPU seconds already charged

    def uncharged_cpu_seconds(self) -> float:
        """Its CPU seconds since the last call, to charge to the optimizer's budget."""
        cpu = self.worker.cpu_seconds
        new, self.charged_cpu = cpu - self.charged_cpu, cpu
        return new

    def request_candidate(self, count: int, nth: int) -> None:
        """Asks for the `nth` candidate of `count` sub-layers, unless one is
        already on its way; every bo_interval-th is Bayesian, the others random."""
        if self.candidate_requested:
            return
        self.candidate_requested = True
        source = "bayes" if nth % self.bo_interval == 0 else "random"
        self.worker.submit(("suggest", count, source))

    def observe(self, coords: Coords, matchness: float) -> None:
        self.worker.submit(("observe", coords, matchness))

    def save(self, path: str, state: SwiftState) -> None:
        self.worker.submit(("save", path, state))
