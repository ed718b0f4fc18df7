"""What a verify step costs, fitted while serving: seconds against the step's
tokens (LinearCost), and whether it verifies drafts (VerifyCost), from running
sums over a window, in Python floats (this runs every engine step).

A verify sample far off its line is clipped before it enters the fit
(VERIFY_CLIP), so that one slow step (another process, the OS) does not move it.
A drafting step's prediction is corrected by how far the line's predictions
of earlier drafting steps fell short (VerifyCost.drafting_bias).
"""

from __future__ import annotations

import math
from collections import deque

# A verify sample more than this many times off its line's prediction (either
# way) enters the fit at that bound, once the line has VERIFY_CLIP_AFTER samples:
# one step that waited on the OS or another process moves the line by a bounded
# amount, and a real change of cost (a new load) still moves it within a few
# steps, as every sample pulls by up to 1.5x.
VERIFY_CLIP = 1.5
VERIFY_CLIP_AFTER = 8
# The drafting-step correction (VerifyCost.drafting_bias), for a window that
# holds no drafting step: then the line is fit on plain steps alone and a
# drafting step's cost is its extrapolation. Under vllm serve at 16 requests
# drafting steps were a few probes and copies among ~200 steps, spaced out
# beyond the 128-step window, and that extrapolation put them 23% too cheap (846
# ms measured against 689, 11 steps; at 1-8 requests within 2-9%:
# benchmarks/results/2026-12-07/serve_20261207-043147.md). Each such step's
# measured over predicted seconds (clipped to VERIFY_CLIP either way) weighs 1,
# earlier ones fade by BIAS_FADE at each new one (~20 such steps of memory), and
# BIAS_PRIOR steps at ratio 1 stand beside them, so that one odd step moves it by
# a few percent. With a drafting step in the window the fit prices it (s): no factor.
BIAS_FADE = 0.95
BIAS_PRIOR = 2.0


class LinearCost:
    """Least-squares line through recent (size, seconds) samples.

    A sample arrives every engine step and the line is read a few times per
    step, so the fit keeps running sums over the window (O(1) per sample, in
    Python floats) instead of refitting the whole window: at batch 1 here the
    numpy refit of 128 samples cost ~0.1 ms a step, np.polyfit before it ~1 ms."""

    def __init__(self, window: int = 128):
        self.samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._sums = [0.0, 0.0, 0.0, 0.0]  # sum x, sum y, sum x*x, sum x*y over the window
        self._added = 0
        self._line: tuple[float, float] | None = None  # (intercept, slope)
        self._single_size: float | None = None  # the window's only size, if it has one

    def add(self, size: float, seconds: float) -> None:
        x, y = float(size), float(seconds)
        if len(self.samples) == self.samples.maxlen:
            self._accumulate(*self.samples[0], sign=-1.0)  # leaves the window
        self.samples.append((x, y))
        self._added += 1
        if self._added % self.samples.maxlen == 0:
            # Recount from the window now and then, so rounding from the
            # subtractions never builds up.
            self._sums = [0.0, 0.0, 0.0, 0.0]
            for sx, sy in self.samples:
                self._accumulate(sx, sy)
        else:
            self._accumulate(x, y)
        self._line = None

    def _accumulate(self, x: float, y: float, sign: float = 1.0) -> None:
        s = self._sums
        s[0] += sign * x
        s[1] += sign * y
        s[2] += sign * x * x
        s[3] += sign * x * y

    def __len__(self) -> int:
        return len(self.samples)

    def clear(self) -> None:
        self.samples.clear()
        self._sums = [0.0, 0.0, 0.0, 0.0]
        self._line = None

    def _fit(self) -> tuple[float, float] | None:
        if self._line is None and self.samples:
            n = len(self.samples)
            sum_x, sum_y, sum_xx, sum_xy = self._sums
            mean_x, mean_y = sum_x / n, sum_y / n
            spread = sum_xx - sum_x * mean_x
            self._single_size = mean_x if spread <= 1e-9 * sum_xx else None
            if self._single_size is not None:
                # One size seen so far: assume cost proportional to size. That is
                # pessimistic where extra tokens are nearly free (GPU) and right on a
                # compute-bound CPU; probes at other sizes correct it.
                self._line = (0.0, mean_y / max(mean_x, 1.0))
            else:
                # A falling cost (noise) is no reason to draft more: flat at the mean.
                slope = max((sum_xy - sum_x * mean_y) / spread, 0.0)
                self._line = (mean_y - slope * mean_x, slope)
        return self._line

    @property
    def single_size(self) -> float | None:
        """The one size all samples in the window have (the line through it is
        a guess beyond that size); None if there are none or several."""
        self._fit()
        return self._single_size

    def predict(self, size: float) -> float | None:
        line = self._fit()
        if line is None:
            return None
        intercept, slope = line
        return max(intercept + slope * size, 1e-6)


class VerifyCost:
    """Seconds of a verify step: v0 + v1 * tokens, plus s if the step verifies
    drafts, least squares over the recent steps of one batch-size bucket.

    Why s: a step that verifies drafts pays for work a plain step skips, once
    per step whatever the draft length: vLLM's rejection sampler (at T > 0 it
    reads target probabilities over the whole vocabulary, 151,936 ids for
    Qwen2.5-Coder-1.5B, for every request and position) and the spec-decode
    bookkeeping around it. A line through plain steps (tokens = requests) and
    drafting steps (more tokens) alone folds that price into its slope: about
    right at the lengths drafted lately, too cheap for shorter drafts. With 8
    requests at T = 1 every method ran at 0.91-0.97x plain while drafting in
    3-6% of its steps (benchmarks/RESULTS.md, 2026-11-25).

    Until both kinds of step, at two sizes or more, are in the window (s and
    the slope cannot be told apart before), s is 0 and the line is the tokens-
    only fit (LinearCost), as is a fit whose s comes out negative (noise)."""

    def __init__(self, window: int = 128):
        self.tokens_only = LinearCost(window)
        self.drafting: deque[bool] = deque(maxlen=window)
        self._sums = [0.0, 0.0, 0.0]  # sum d, sum d*x, sum d*y over the window (d: 0/1)
        self._added = 0
        self._fit: tuple[float, float, float] | None = None  # (v0, v1, s)
        self._log_bias = 0.0  # faded sum of log(measured / predicted), drafting steps
        self._bias_weight = 0.0
        self.drafting_bias = 1.0

    def add(self, size: float, seconds: float, drafting: bool = False) -> None:
        if len(self) >= VERIFY_CLIP_AFTER:
            predicted = self._predict(size, drafting)
            if drafting and self._sums[0] < 0.5:  # no drafting step in the window
                ratio = min(max(seconds / predicted, 1 / VERIFY_CLIP), VERIFY_CLIP)
                self._log_bias = BIAS_FADE * self._log_bias + math.log(ratio)
                self._bias_weight = BIAS_FADE * self._bias_weight + 1.0
                self.drafting_bias = math.exp(
                    self._log_bias / (self._bias_weight + BIAS_PRIOR))
            seconds = min(max(seconds, predicted / VERIFY_CLIP), predicted * VERIFY_CLIP)
        if len(self.drafting) == self.drafting.maxlen:
            self._accumulate(*self.tokens_only.samples[0], self.drafting[0], sign=-1.0)
        self.tokens_only.add(size, seconds)
        self.drafting.append(bool(drafting))
        self._added += 1
        if self._added % self.drafting.maxlen == 0:  # recount, as LinearCost does
            self._sums = [0.0, 0.0, 0.0]
            for (x, y), d in zip(self.tokens_only.samples, self.drafting):
                self._accumulate(x, y, d)
        else:
            self._accumulate(float(size), float(seconds), drafting)
        self._fit = None

    def _accumulate(self, x: float, y: float, d: bool, sign: float = 1.0) -> None:
        if d:
            s = self._sums
            s[0] += sign
            s[1] += sign * x
            s[2] += sign * y

    def __len__(self) -> int:
        return len(self.tokens_only.samples)

    @property
    def single_size(self) -> float | None:
        return self.tokens_only.single_size

    @property
    def per_token(self) -> float:
        """v1: what each more token of a step costs (seconds)."""
        return self._line()[1]

    @property
    def drafting_price(self) -> float:
        """s: what verifying drafts costs a step on top of its tokens (seconds)."""
        return self._line()[2]

    def _line(self) -> tuple[float, float, float]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float, float]:
        line = self.tokens_only._fit()
        fallback = (line[0], line[1], 0.0) if line else (0.0, 0.0, 0.0)
        n = len(self.drafting)
        num_drafting, sum_dx, sum_dy = self._sums
        if n == 0 or num_drafting < 0.5 or n - num_drafting < 0.5:
            return fallback
        sum_x, sum_y, sum_xx, sum_xy = self.tokens_only._sums
        solved = solve_3x3(((n, sum_x, num_drafting),
                            (sum_x, sum_xx, sum_dx),
                            (num_drafting, sum_dx, num_drafting)), (sum_y, sum_xy, sum_dy))
        if solved is None:
            return fallback  # one size per kind of step: s and v1 not apart
        v0, v1, s = solved
        if v1 < 0:
            # Extra tokens free (a GPU) or noise: flat, plain steps' mean plus s.
            v0 = (sum_y - sum_dy) / (n - num_drafting)
            v1, s = 0.0, sum_dy / num_drafting - v0
        if s < 0:
            return fallback
        return v0, v1, s

    def predict(self, size: float, drafting: bool = False) -> float | None:
        """Seconds of a step of `size` tokens; with no drafting step in the
        window, a drafting step's is the plain steps' line times drafting_bias."""
        # Read ~14 times a step by the policy: no call beyond the cached fit.
        if not self.tokens_only.samples:
            return None
        v0, v1, s = self._fit or self._line()
        if not drafting:
            return max(v0 + v1 * size, 1e-6)
        if self._sums[0] < 0.5:
            return max(v0 + v1 * size, 1e-6) * self.drafting_bias
        return max(v0 + v1 * size + s, 1e-6)

    def _predict(self, size: float, drafting: bool) -> float:
        """The line's own prediction, without the drafting correction."""
        v0, v1, s = self._fit or self._line()
        return max(v0 + v1 * size + (s if drafting else 0.0), 1e-6)


def solve_3x3(a, b, max_condition: float = 1e10) -> tuple[float, float, float] | None:
    """x with a x = b for a 3x3 `a`, by Cramer's rule in Python floats; None
    where `a` is (nearly) singular: its condition number, estimated as
    ||a||_F ||a^-1||_F (at most 3x the 2-norm one), above `max_condition`.
    Runs every engine step: np.linalg.cond and solve cost ~0.2 ms a step at
    batch 1 (an SVD), 0.4% of a SmolLM2 decode step here, this ~10 us."""
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = a
    c00, c01, c02 = a11 * a22 - a12 * a21, a12 * a20 - a10 * a22, a10 * a21 - a11 * a20
    det = a00 * c00 + a01 * c01 + a02 * c02
    if det == 0.0:
        return None
    # The adjugate's rows: a^-1 = adj / det.
    adj = ((c00, a02 * a21 - a01 * a22, a01 * a12 - a02 * a11),
           (c01, a00 * a22 - a02 * a20, a02 * a10 - a00 * a12),
           (c02, a01 * a20 - a00 * a21, a00 * a11 - a01 * a10))
    norm = sum(v * v for row in a for v in row) ** 0.5
    norm_inv = sum(v * v for row in adj for v in row) ** 0.5 / abs(det)
    if not norm * norm_inv <= max_condition:  # also catches inf and nan
        return None
    return tuple(sum(adj[i][j] * b[j] for j in range(3)) / det for i in range(3))
