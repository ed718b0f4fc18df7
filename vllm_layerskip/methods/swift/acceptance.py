"""SWIFT's acceptance feedback: draft acceptance over the current phase, and
whether acceptance over the last verify steps has fallen below what it was at
the phase's start (the text stream changed: optimization resumes)."""

from __future__ import annotations

from collections import deque

# Acceptance needs this many verified draft tokens before it decides anything.
MIN_ACCEPTANCE_TOKENS = 64


class PhaseAcceptance:
    def __init__(self):
        self.recent = deque()  # (drafted, accepted) of the last verify steps
        self.reset()

    def reset(self) -> None:
        """A new phase: nothing counted yet."""
        self.drafted = self.accepted = 0
        self.baseline: float | None = None
        self.recent.clear()

    @property
    def rate(self) -> float | None:
        """The phase's acceptance so far; None before any draft token."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def measured(self) -> bool:
        """Enough of the phase's draft tokens were verified to decide on its rate."""
        return self.drafted >= MIN_ACCEPTANCE_TOKENS

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def fallen_below(self, fraction: float, drafted: int, accepted: int) -> float | None:
        """For a phase watched for a drop, after `add` of a verify step: the
        acceptance over the last MIN_ACCEPTANCE_TOKENS draft tokens if it is under
        `fraction` of the phase's first MIN_ACCEPTANCE_TOKENS (`baseline`), else None."""
        if self.baseline is None:
            if self.measured:
                self.baseline = self.accepted / self.drafted
            return None
        self.recent.append((drafted, accepted))
        while sum(d for d, _ in self.recent) - self.recent[0][0] >= MIN_ACCEPTANCE_TOKENS:
            self.recent.popleft()
        recent_drafted = sum(d for d, _ in self.recent)
        if recent_drafted < MIN_ACCEPTANCE_TOKENS:
            return None
        recent = sum(a for _, a in self.recent) / recent_drafted
        return recent if recent < fraction * self.baseline else None
