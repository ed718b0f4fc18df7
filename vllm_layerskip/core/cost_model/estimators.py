"""What the cost model measures while serving: a verify step's seconds, a draft
forward's seconds and each draft position's acceptance, each robust to the odd
slow or fast step (core/cost_model/policy.py decides from them).

A decision rests on many samples, never on one: the draft cost is a median per
size bucket, a verify sample far off its line is clipped before it enters the
fit (VERIFY_CLIP), and acceptance forgets exponentially. Two engines of one
command read 1.17x and 1.52x when a single slow draft pass could stand for the
draft's cost until the window turned over (a mean over 32 samples, with only
probes adding samples once drafting was off).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# A verify sample more than this many times off its line's prediction (either
# way) enters the fit at that bound, once the line has VERIFY_CLIP_AFTER samples:
# one step that waited on the OS or another process moves the line by a bounded
# amount, and a real change of cost (a new load) still moves it within a few
# steps, as every sample pulls by up to 1.5x.
VERIFY_CLIP = 1.5
VERIFY_CLIP_AFTER = 8


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

    def add(self, size: float, seconds: float, drafting: bool = False) -> None:
        if len(self) >= VERIFY_CLIP_AFTER:
            predicted = self.predict(size, drafting)
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
        return len(self.tokens_only)

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
        if not len(self):
            return None
        v0, v1, s = self._line()
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


@dataclass
class PositionAcceptance:
    """Conditional acceptance rate of each draft position, exponentially forgetting."""

    max_k: int
    decay: float = 0.98
    prior_rate: float = 0.5
    prior_weight: float = 1.0
    accepted: np.ndarray = field(init=False)
    offered: np.ndarray = field(init=False)

    def __post_init__(self):
        self.accepted = np.zeros(self.max_k)
        self.offered = np.zeros(self.max_k)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One request's verify result: positions 1..num_accepted were accepted and,
        if it is shorter than the draft, position num_accepted+1 was rejected."""
        if num_drafted <= 0:
            return
        self.age(self.decay)
        reached = min(num_accepted + 1, num_drafted)
        self.offered[:reached] += 1
        self.accepted[:num_accepted] += 1

    def age(self, factor: float) -> None:
        """Let the evidence fade without a new observation (a step without drafts)."""
        self.accepted *= factor
        self.offered *= factor

    def rates(self) -> np.ndarray:  # [max_k]
        # A position with little data borrows the estimate of the one before it:
        # positions beyond the lengths drafted lately are then neither written
        # off nor overrated, and longer drafts get tried when the early ones do well.
        # (Python floats: this runs every engine step, on K <= ~10 numbers, where
        # numpy's per-element indexing costs more than the arithmetic.)
        w = self.prior_weight
        rates, prior = [], self.prior_rate
        for accepted, offered in zip(self.accepted.tolist(), self.offered.tolist()):
            prior = (accepted + w * prior) / (offered + w)
            rates.append(prior)
        return np.array(rates)


class DraftCost:
    """Seconds of one draft forward against the rows it runs: the median of the
    last `window` samples of each size bucket (rows rounded up to a power of
    two), and a line through those medians between and beyond them.

    Once drafting is off only probes add samples, a handful in a thousand
    steps, so each sample stays long: a mean let one slow pass (the first
    calls, another process busy) keep drafting off for a whole run. A median
    moves by one rank per sample, so it takes half a bucket's window of slow
    passes to change a decision."""

    def __init__(self, window: int = 16):
        self.window = window
        self.buckets: dict[int, deque[tuple[float, float]]] = {}
        self._points: list[tuple[float, float]] | None = None
        self._line: tuple[float, float, float] | None = None  # mean size, mean seconds, slope

    @staticmethod
    def bucket_of(size: float) -> int:
        return 1 << (max(int(round(size)), 1) - 1).bit_length()

    def add(self, size: float, seconds: float) -> None:
        key = self.bucket_of(size)
        samples = self.buckets.get(key)
        if samples is None:
            samples = self.buckets[key] = deque(maxlen=self.window)
        samples.append((float(size), float(seconds)))
        self._points = None

    def clear(self) -> None:
        self.buckets.clear()
        self._points = None

    def drop_slower(self, size: float, seconds: float) -> None:
        """Leave out the samples of size's bucket slower than `seconds`."""
        samples = self.buckets.get(self.bucket_of(size))
        if samples and max(y for _, y in samples) > seconds:
            kept = [(x, y) for x, y in samples if y <= seconds]
            samples.clear()
            samples.extend(kept)
            self._points = None

    def __len__(self) -> int:
        return sum(len(s) for s in self.buckets.values())

    def count_at(self, size: float) -> int:
        """Samples in the bucket of `size`."""
        return len(self.buckets.get(self.bucket_of(size), ()))

    @property
    def sizes(self) -> list[float]:
        return [x for samples in self.buckets.values() for x, _ in samples]

    def points(self) -> list[tuple[float, float]]:
        """(median size, median seconds) of each bucket, by size."""
        if self._points is None:
            self._points = sorted(
                (_median([x for x, _ in s]), _median([y for _, y in s]))
                for s in self.buckets.values() if s)
            self._line = None
            if len(self._points) > 1:
                n = len(self._points)
                mean_x = sum(x for x, _ in self._points) / n
                mean_y = sum(y for _, y in self._points) / n
                spread = sum((x - mean_x) ** 2 for x, _ in self._points)
                slope = sum((x - mean_x) * (y - mean_y) for x, y in self._points) / spread \
                    if spread > 0 else 0.0
                # A falling cost (noise) is no reason to draft more: flat at the mean.
                self._line = (mean_x, mean_y, max(slope, 0.0))
        return self._points

    @property
    def single_size(self) -> float | None:
        points = self.points()
        return points[0][0] if len(points) == 1 else None

    def predict(self, size: float) -> float | None:
        points = self.points()
        if not points:
            return None
        for x, y in points:
            if abs(x - size) < 1e-9:
                return max(y, 1e-6)
        if len(points) == 1:
            # One size seen so far: cost proportional to size, pessimistic where
            # more rows are nearly free (GPU) and right on a compute-bound CPU;
            # probes at other sizes correct it.
            x, y = points[0]
            return max(y * size / max(x, 1.0), 1e-6)
        mean_x, mean_y, slope = self._line
        return max(mean_y + slope * (size - mean_x), 1e-6)


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def expected_tokens(rates: np.ndarray, k: int) -> float:
    """Tokens one request gains from a step drafting k tokens (>= 1)."""
    return 1.0 + float(np.cumprod(rates[:k]).sum()) if k > 0 else 1.0


def argmax_length(rates, seconds: Callable[[int], float], base_tokens: float,
                  reach: float, margin: float, max_length: int | None = None
                  ) -> tuple[int, float]:
    """The draft length k (0..len(rates)) with the most tokens per second, and
    that rate: a step drafting k tokens yields base_tokens + reach *
    sum_{j<=k} prod_{i<=j} rates[i] tokens in expectation (vLLM stops at the
    first rejected draft; `reach`: how many requests' drafts count) and takes
    seconds(k). k = 0 wins ties by `margin` (no dithering on noise). Every
    choice of the cost model (self-draft, copy, continuation) is this one
    routine with its own tokens and seconds."""
    rates = list(rates)[: max_length if max_length is not None else None]
    best_k, best = 0, base_tokens / seconds(0) * (1 + margin)
    gain, chain = 0.0, 1.0
    for k, rate in enumerate(rates, start=1):
        chain *= rate
        gain += chain
        t = (base_tokens + reach * gain) / seconds(k)
        if t > best:
            best_k, best = k, t
    return best_k, best
