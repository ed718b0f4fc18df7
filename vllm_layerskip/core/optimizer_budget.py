"""How much decoding time an online skip-set optimizer may take (SWIFT's
candidate scoring and Bayesian optimization, CLaSp's DP).

Both run on the cores that decode, so every second they compute is taken from
decoding. The budget is a share of the engine's busy time, kept as a token
bucket: each engine step adds `share` of the time since the last step, the
optimizer's work is charged when it is done, and a due run goes ahead only
when the credit covers its expected cost (what the last run cost), so runs keep
the share's pace from the start. (Allowed at any credit >= 0, SWIFT's first
~60 ms scoring pass on SmolLM2 ran at once and overdrew, and the next ones came
as soon as each overdraft was repaid: its own work was 0.33 ms of every
drafting-free step over 1.5 minutes against 0.10 ms over 5,
benchmarks/results/2026-12-07/interleaved_20261207-002127.md.)

At most what the share earns in CREDIT_WINDOW_S of engine time (or one run, if
that costs more) can be saved up, so time unused while optimizing was
impossible (no text to score, drafting off) is not spent later in one burst of
slow steps. (A fixed 0.5 s bucket, right for the old 0.1 share, let CLaSp's DP
take 8% of a short 8-request workload at a 0.01 share: it had saved up 0.5 s
over the batch-1 workload before.)

Callers pass times in, so their own clocks (and tests' fake ones) decide.
"""

from __future__ import annotations

# Gaps between steps longer than this are idle time, not engine work.
MAX_STEP_GAP_S = 1.0
# Optimizer time saved up: at most what the share earns in this much engine time.
CREDIT_WINDOW_S = 5.0
# While the cost model keeps self-drafts off, an optimizer earns 1/IDLE_SLOWDOWN
# of its share (and SWIFT steps that many times less often): the requests gain
# nothing from it then, but a set that pays can still be found. In SmolLM2 steps
# that drafted nothing, at full share: SWIFT 0.41 ms (1.7% of a plain step; the
# share, not the rate, bound it), CLaSp 0.35-0.46 ms against 0.23 ms at an eighth
# (benchmarks/results/2026-12-06, interleaved_20261206-00*).
IDLE_SLOWDOWN = 8


class OptimizerBudget:
    def __init__(self, share: float, first_run_steps: float = 0.0):
        """`first_run_steps`: what the first run is expected to cost, in engine
        steps of the mean length so far (the credit it waits for); later runs
        are expected to cost what the last did."""
        self.share = share  # (0, 1]; 1: no cap
        self.first_run_steps = first_run_steps
        self.last_run: float | None = None  # seconds
        self.credit = 0.0  # seconds of optimizer work the cap allows now
        self.busy_seconds = 0.0  # engine time counted so far
        self.busy_steps = 0
        self._last_step: float | None = None

    @property
    def expected_run(self) -> float:
        if self.last_run is not None:
            return self.last_run
        mean_step = self.busy_seconds / self.busy_steps if self.busy_steps else 0.0
        return self.first_run_steps * mean_step

    @property
    def max_credit(self) -> float:
        return max(self.share * CREDIT_WINDOW_S, self.expected_run)

    def step(self, now: float, learning: bool = True) -> None:
        """Once per engine step, with the caller's clock; `learning`: whether
        self-drafts are in use (otherwise the time since the last step earns
        1/IDLE_SLOWDOWN of the share)."""
        if self._last_step is not None:
            busy = min(now - self._last_step, MAX_STEP_GAP_S)
            self.busy_seconds += busy
            self.busy_steps += 1
            rate = 1.0 if learning else 1.0 / IDLE_SLOWDOWN
            self.credit = min(self.credit + rate * self.share * busy, self.max_credit)
        self._last_step = now

    def pause(self) -> None:
        """The time until the next step is not the engine's (drafting paused by
        a benchmark: its plain steps are measured apart): it earns no credit.
        Without this, bench_interleaved.py's paused spans (two thirds of the
        time) paid SWIFT's and CLaSp's optimizers, which then took ~3% of the
        drafting spans' steps at a 0.01 share."""
        self._last_step = None

    def charge(self, seconds: float, run: bool = True) -> None:
        """`run`: `seconds` is one optimizer run's cost, what the next run is
        expected to cost; False for work between runs (SWIFT's thread)."""
        self.credit -= seconds
        if run:
            self.last_run = seconds

    def allows(self) -> bool:
        """Whether a due optimizer run may go ahead now: the credit covers its
        expected cost."""
        return self.share >= 1.0 or self.credit >= self.expected_run
