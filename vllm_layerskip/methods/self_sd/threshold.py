"""Self-SD's adaptive draft-exiting threshold (Draft & Verify, Eq. 2-4; the
update rule is stated in proposer.py's docstring)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdaptiveThreshold:
    """The draft-exiting threshold and its update rule (Eq. 2-4)."""

    gamma: float = 0.6
    target: float = 0.85  # alpha
    step: float = 0.01  # epsilon
    beta1: float = 0.5
    beta2: float = 0.9
    acceptance: float | None = None  # AR; None before the first verification
    updates: int = 0

    def update(self, acceptance_e: float) -> float:
        if self.acceptance is None:  # e = 1: beta_1 = 0
            self.acceptance = acceptance_e
        else:
            self.acceptance = self.beta1 * self.acceptance + (1 - self.beta1) * acceptance_e
        moved = self.gamma + self.step if self.acceptance <= self.target else self.gamma - self.step
        self.gamma = self.beta2 * self.gamma + (1 - self.beta2) * moved
        self.updates += 1
        return self.gamma
