"""What the cost model measures while serving, beside the verify step's cost
(verify_cost.py): a draft forward's seconds and each draft position's
acceptance, each robust to the odd slow or fast step, and the one routine that
turns them into a best length (core/cost_model/policy.py decides with it).

A decision rests on many samples, never on one: the draft cost is a median per
size bucket, a verify sample far off its line is clipped before it enters the
fit (verify_cost.VERIFY_CLIP), and acceptance forgets exponentially. Two engines of one
command read 1.17x and 1.52x when a single slow draft pass could stand for the
draft's cost until the window turned over (a mean over 32 samples, with only
probes adding samples once drafting was off).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np



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


class PredictionCheck:
    """How the costs the decision weighed compared with what the step then
    took: mean predicted and measured seconds, the prediction made before the
    measurement joined the estimate. A bias at some load (the verify line of 16
    requests too cheap, say) shows in the status, not only as a lost speedup."""

    def __init__(self):
        self.count = 0
        self.predicted = 0.0
        self.measured = 0.0

    def add(self, predicted: float, measured: float) -> None:
        self.count += 1
        self.predicted += predicted
        self.measured += measured

    def as_dict(self) -> dict:
        n = max(self.count, 1)
        return {"steps": self.count, "predicted_ms": round(1000 * self.predicted / n, 1),
                "measured_ms": round(1000 * self.measured / n, 1)}


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

    def cheapest(self, size: float) -> float | None:
        """The fastest recent pass of size's bucket, scaled to `size` by
        proportion; the prediction where that bucket has no samples."""
        samples = self.buckets.get(self.bucket_of(size))
        if not samples:
            return self.predict(size)
        return min(y * size / max(x, 1.0) for x, y in samples)

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
    # Python floats: numpy scalars make this loop several times slower, and it
    # runs a few times every engine step.
    rates = (rates.tolist() if hasattr(rates, "tolist") else list(rates))[:max_length]
    best_k, best = 0, base_tokens / seconds(0) * (1 + margin)
    gain, chain = 0.0, 1.0
    for k, rate in enumerate(rates, start=1):
        chain *= rate
        gain += chain
        t = (base_tokens + reach * gain) / seconds(k)
        if t > best:
            best_k, best = k, t
    return best_k, best
