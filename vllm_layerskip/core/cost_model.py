"""Online cost model: choose each step's draft length to maximize tokens per second.

A step that drafts k tokens per request costs k draft forwards plus one verify
pass over the batch's tokens, and yields, per request, 1 + sum_{j<=k} prod_{i<=j} a_i
tokens in expectation, where a_i is the conditional acceptance rate of draft
position i (vLLM stops at the first rejected draft). k = 0 is plain decoding.

Everything is measured while serving:
- the verify step time as a linear function of the tokens it processed,
  v(n) = v0 + v1 * n (on a GPU, v1 is small: verifying a few tokens costs about one
  decode step; on a CPU it is not), one line per batch size (requests in the
  step, rounded up to a power of two): the cost of a token is not one line across
  batch sizes. On Qwen2.5-Coder-1.5B on a 2-core CPU one request's step is
  memory-bound (9 tokens cost ~1.07 steps of 1) and eight requests' is not (8
  tokens cost 1.75 steps of 1, and more tokens cost in proportion); one line fit
  to both underestimated what drafts cost at 8 requests, and every method drafted
  there at 0.86-0.96x plain (benchmarks/RESULTS.md, 2026-11-25). Each line has a
  price of its own for steps that verify any draft (VerifyCost);
- the draft forward time as a linear function of the rows it drafts for;
- the per-position acceptance, from how many of last step's drafts each request
  kept, with exponential forgetting so a shift in the text is followed.

While drafting does not pay it stays off, and the policy probes now and then with a
short draft for a few of the batch's requests to keep the acceptance estimates
fresh (a better skip set, an easier stream); the probe interval doubles while
probes keep confirming "off", so the probing overhead vanishes on long runs.
A draft forward that costs as much as a plain step cannot pay at any acceptance
rate (draft_can_pay): then the first steps stop early and the probes draft one
token, enough to notice a draft that got cheaper.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


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
        a = np.array([[n, sum_x, num_drafting],
                      [sum_x, sum_xx, sum_dx],
                      [num_drafting, sum_dx, num_drafting]])
        b = np.array([sum_y, sum_xy, sum_dy])
        if np.linalg.cond(a) > 1e10:
            return fallback  # one size per kind of step: s and v1 not apart
        v0, v1, s = np.linalg.solve(a, b).tolist()
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


# Draft length of the first steps and of the probes while drafting is off: the
# first positions' acceptance decides whether any length pays, and a short draft
# costs little where none does (a server's first steps under load drafted K for
# every request). Longer drafts follow once these pay: a position with little
# data borrows the rate of the one before it (PositionAcceptance.rates).
PROBE_LENGTH = 2
# Requests a probe (or a first step) drafts for: the others decode plainly that
# step. A probe has to refresh the acceptance estimates and the draft cost, not
# to gain tokens; at 58 requests on this CPU, a probe step drafting for all of
# them cost several plain steps (benchmarks/load_test.py, 2026-11-24), and a GPU's
# verify pass stops being free at such sizes too. Probes alternate between
# PROBE_ROWS and twice that many, so the draft cost is measured at two sizes and
# its line (flat on a GPU, steep on a CPU) extrapolates to the full batch. Which
# rows rotates (core/proposer.py), so no request's text dominates the estimate.
PROBE_ROWS = 4
# While the skip set's drafts are off, their acceptance evidence fades by this
# factor per step, so the next probe speaks for the text being written now, not
# for the text that turned drafting off. Without it, a probe weighed 1 against
# ~50 older observations (decay 0.98 per observation) and, with the probe
# interval doubling, drafting that turned off in one request stayed off through
# the next, easier ones: on Qwen2.5-Coder-1.5B at fixed K = 3 `clasp`'s drafts
# pay in coding and math (1.25x, 2026-11-25) and not in qa (0.75x). Simulated
# (48-step requests alternating acceptance 0.3-0.85, draft 0.47 of a step,
# 4 seeds): 0.985-1.049x plain without fading, 1.025-1.068x at 0.95 (the
# per-request best fixed length: ~1.12x); on streams where drafting never pays
# 0.979-0.989x against 0.987-0.996x (tests/unit/test_cost_model.py).
IDLE_FADE = 0.95
# A draft-cost sample this many times off the line's prediction (DraftLengthPolicy
# .observe_draft). Once drafting is off, only probes add samples (a handful in a
# thousand steps), so one slow pass stays in the window: simulated at batch 1
# with Qwen2.5-Coder-1.5B's int4 costs (verify 95 ms, draft 40 ms, 95% accepted),
# a first pass of 200 ms kept drafting off for 1000 steps (6 samples, draft read
# as 67 ms); a Spec-Bench run of 2026-12-02 self-drafted in under 1% of its steps,
# its draft read as 59.7 ms against 32-43 ms a pass in draft_pass_breakdown.py
# the same hour (tests/unit/test_cost_model.py).
DRAFT_OUTLIER = 3.0


class DraftPlan(NamedTuple):
    """One step's decision: `length` tokens (0: no drafting) for at most `rows`
    of the step's requests."""

    length: int
    rows: int


def expected_tokens(rates: np.ndarray, k: int) -> float:
    """Tokens one request gains from a step drafting k tokens (>= 1)."""
    return 1.0 + float(np.cumprod(rates[:k]).sum()) if k > 0 else 1.0


@dataclass
class DraftLengthPolicy:
    max_k: int
    probe_interval: int = 16
    max_probe_interval: int = 512
    warmup_steps: int = 4
    # Draft only if it beats plain decoding by this much (avoids dithering on noise).
    margin: float = 0.03

    def __post_init__(self):
        self.acceptance = PositionAcceptance(self.max_k)
        # Drafts copied from the context (prompt lookup): accepted at their own
        # rates, and cost no draft pass, only their verification.
        self.lookup_acceptance = PositionAcceptance(self.max_k)
        self.steps_since_lookup_probe = 0
        self.lookup_steps = 0
        self.lookup_length_sum = 0
        self.continuation_steps = 0  # steps that continued copies with a self-draft
        # One verify-cost line per batch-size bucket (verify_line); the step
        # being planned reads its own bucket's line.
        self.verify_costs: dict[int, VerifyCost] = {}
        self.verify_cost = self.verify_line(1)
        # Draft forwards are timed only while drafting: once drafting is off,
        # one sample per probe, so a long window would take hundreds of probes
        # to notice a draft that got cheaper (a new skip set).
        self.draft_cost = LinearCost(window=32)
        self.steps = 0
        self.steps_drafting = 0
        self.draft_length_sum = 0
        self.steps_since_probe = 0
        self.num_probes = 0  # first steps included
        self.current_probe_interval = self.probe_interval

    # ---- what was measured ---------------------------------------------------

    def verify_line(self, num_reqs: int) -> VerifyCost:
        """The verify-cost line of steps with `num_reqs` requests: one per
        power of two (1, 2, 3-4, 5-8, ...). A bucket with no samples yet makes
        the policy probe before it drafts there (choose, lookup_length)."""
        bucket = 1 << (max(int(num_reqs), 1) - 1).bit_length()
        line = self.verify_costs.get(bucket)
        if line is None:
            line = self.verify_costs[bucket] = VerifyCost()
        return line

    def observe_verify(self, num_tokens: int, seconds: float, num_reqs: int | None = None) -> None:
        """A verify step of `num_tokens` tokens over `num_reqs` requests (None:
        the bucket of the step last planned) took `seconds`. A decode step
        schedules one token per request plus its drafts: more tokens than
        requests is a step that verified drafts."""
        line = self.verify_cost if num_reqs is None else self.verify_line(num_reqs)
        drafting = num_reqs is not None and num_tokens > num_reqs
        predicted = line.predict(num_tokens, drafting)
        # A gap far longer than predicted is the engine idling between requests,
        # not the cost of the step.
        if predicted is not None and len(line) >= 8 and seconds > 5 * predicted:
            return
        line.add(num_tokens, seconds, drafting)

    def observe_draft(self, num_rows: int, seconds_per_forward: float) -> None:
        """A draft forward for `num_rows` rows took `seconds_per_forward`. Against
        the line at a size it was measured around (not extrapolated to), a pass
        DRAFT_OUTLIER times slower than predicted is a spike (once the line has
        two samples) and is left out; one that many times faster means the
        window's samples were (a slow first pass) or the draft got that much
        cheaper: the window starts again from it."""
        sizes = [size for size, _ in self.draft_cost.samples]
        if sizes and min(sizes) <= num_rows <= max(sizes):
            predicted = self.draft_cost.predict(num_rows)
            if len(self.draft_cost) >= 2 and seconds_per_forward > DRAFT_OUTLIER * predicted:
                return
            if seconds_per_forward * DRAFT_OUTLIER < predicted:
                self.draft_cost.clear()
        self.draft_cost.add(num_rows, seconds_per_forward)

    def observe_acceptance(self, num_drafted: int, num_accepted: int, lookup: bool = False) -> None:
        (self.lookup_acceptance if lookup else self.acceptance).observe(num_drafted, num_accepted)

    # ---- the decision --------------------------------------------------------

    def throughput(self, k: int, num_reqs: int) -> float | None:
        """Expected tokens per second of a step drafting k tokens per request."""
        verify = self.verify_cost.predict(num_reqs * (1 + k), drafting=k > 0)
        draft = self.draft_cost.predict(num_reqs) if k > 0 else 0.0
        if verify is None or draft is None:
            return None
        tokens = num_reqs * expected_tokens(self.acceptance.rates(), k)
        return tokens / (k * draft + verify)

    def best_length(self, num_reqs: int, others: tuple[float, int] = (0.0, 0)) -> int:
        """argmax over k of the step's throughput with num_reqs requests drafting
        k tokens each, plain decoding (k = 0) ahead by `margin`. `others`: the
        expected tokens and verified tokens of the step's other requests (lookup
        drafts), which share the verify pass. Runs every engine step: the
        expected tokens of every k come from one pass over the acceptance rates,
        not one per k."""
        other_tokens, other_verified = others
        # With lookup drafts in the step (others), it verifies drafts even at k = 0.
        plain_verify = self.verify_cost.predict(num_reqs + other_verified,
                                                drafting=other_verified > 0)
        draft = self.draft_cost.predict(num_reqs)
        if plain_verify is None or draft is None:
            return self.max_k
        best_k, best = 0, (num_reqs + other_tokens) / plain_verify * (1 + self.margin)
        tokens, chain = 1.0, 1.0  # expected tokens per request; P(first k accepted)
        for k, rate in enumerate(self.acceptance.rates().tolist(), start=1):
            chain *= rate
            tokens += chain
            verify = self.verify_cost.predict(num_reqs * (1 + k) + other_verified, drafting=True)
            t = (num_reqs * tokens + other_tokens) / (k * draft + verify)
            if t > best:
                best_k, best = k, t
        return best_k

    def lookup_length(self, num_reqs: int, num_lookup: int) -> int:
        """Tokens each of the `num_lookup` requests with a lookup draft drafts
        this step: the argmax of the step's throughput if the other requests
        decoded plainly (a lookup draft costs only its verification, so this
        rarely depends on them), plain decoding ahead by `margin`. 0: they
        self-draft like the others; every probe interval they try PROBE_LENGTH
        again, so a stream that starts copying is noticed."""
        if len(self.verify_cost) == 0:
            return min(PROBE_LENGTH, self.max_k)
        verify = self.verify_cost.predict
        best_k, best = 0, num_reqs / verify(num_reqs) * (1 + self.margin)
        tokens, chain = 1.0, 1.0
        for k, rate in enumerate(self.lookup_acceptance.rates().tolist(), start=1):
            chain *= rate
            tokens += chain
            t = (num_lookup * tokens + num_reqs - num_lookup) / verify(num_reqs + num_lookup * k,
                                                                      drafting=True)
            if t > best:
                best_k, best = k, t
        if best_k:
            self.steps_since_lookup_probe = 0
            return best_k
        self.steps_since_lookup_probe += 1
        if self.steps_since_lookup_probe >= self.probe_interval:
            self.steps_since_lookup_probe = 0
            return min(PROBE_LENGTH, self.max_k)
        return 0

    def continuation_length(self, num_reqs: int, self_plan: tuple[int, int],
                            copy_lengths: np.ndarray, run_out_lengths: np.ndarray) -> int:
        """Self-draft tokens that continue the copied drafts which ran out
        (`run_out_lengths`: their m copied tokens each), 0: none. The step also
        verifies the other copied drafts (`copy_lengths`) and `self_plan` =
        (length, requests) of self-drafts. Continuation tokens count only where
        the whole copy is accepted (the lookup rates), and they share the step's
        draft passes: its first pass also feeds the m copied tokens. Nothing
        measured yet: 0 (no continuation on a guess)."""
        n = len(run_out_lengths)
        if not n or len(self.draft_cost) == 0 or len(self.verify_cost) == 0:
            return 0
        draft, verify = self.draft_cost.predict, self.verify_cost.predict
        self_length, self_rows = self_plan
        lookup_rates, rates = self.lookup_acceptance.rates(), self.acceptance.rates()
        copies = np.concatenate([copy_lengths, run_out_lengths]).astype(np.int64)
        tokens = (num_reqs + sum(expected_tokens(lookup_rates, int(m)) - 1 for m in copies)
                  + self_rows * (expected_tokens(rates, self_length) - 1))
        verified = num_reqs + int(copies.sum()) + self_rows * self_length
        # Requests whose whole copy is accepted, in expectation: those a continuation reaches.
        reach = sum(float(np.prod(lookup_rates[:m])) for m in run_out_lengths)
        first_pass = int((run_out_lengths + 1).sum())

        def draft_seconds(j: int) -> float:
            total = 0.0
            for step in range(max(self_length, j)):
                size = (self_rows if step < self_length else 0) + (
                    (first_pass if step == 0 else n) if step < j else 0)
                total += draft(size) if size else 0.0
            return total

        base_verify = verify(verified, drafting=verified > num_reqs)
        best_j, best = 0, tokens / (draft_seconds(0) + base_verify) * (1 + self.margin)
        gain, chain = 0.0, 1.0
        for j, rate in enumerate(rates[: self.max_k - int(run_out_lengths.min())].tolist(), start=1):
            chain *= rate
            gain += chain
            t = (tokens + reach * gain) / (draft_seconds(j) + verify(verified + n * j, drafting=True))
            if t > best:
                best_j, best = j, t
        self.continuation_steps += best_j > 0
        return best_j

    def draft_can_pay(self, num_reqs: int) -> bool:
        """Whether some draft length could beat plain decoding at this batch
        size if every draft token were accepted. Verifying never costs less than
        a plain step v, so k drafts of d seconds each gain at most k tokens for
        k*d more seconds: the speedup is at most (1 + k) / (1 + k*d/v), below 1
        for d >= v. Where a line is known at one size only, d and v are read
        at the side of that size that cannot overstate d/v (proportional
        extrapolation would: up for d, down for v)."""
        size = self.draft_cost.single_size
        draft = self.draft_cost.predict(num_reqs if size is None else min(num_reqs, size))
        size = self.verify_cost.single_size
        plain = self.verify_cost.predict(num_reqs if size is None else max(num_reqs, size))
        if draft is None or plain is None:
            return True
        k = self.max_k
        return (1 + k) / (1 + k * draft / plain) > 1 + self.margin

    def choose_with_lookup(self, num_reqs: int, prefilling: bool,
                           num_lookup: int) -> tuple[int, DraftPlan]:
        """(lookup length, plan): the draft length of the `num_lookup` requests
        that have a lookup draft (core/lookup.py; 0: they self-draft like the
        others), and the plan of the requests that self-draft."""
        self.verify_cost = self.verify_line(num_reqs)
        lookup = 0
        if num_lookup and not (prefilling and len(self.verify_cost) == 0):
            lookup = self.lookup_length(num_reqs, num_lookup)
        if not lookup:
            return 0, self._choose(num_reqs, prefilling, (0.0, 0))
        self.lookup_steps += 1
        self.lookup_length_sum += lookup
        rates = self.lookup_acceptance.rates()
        others = (num_lookup * expected_tokens(rates, lookup), num_lookup * (1 + lookup))
        return lookup, self._choose(num_reqs - num_lookup, prefilling, others)

    def choose(self, num_reqs: int, prefilling: bool = False,
               others: tuple[float, int] = (0.0, 0)) -> DraftPlan:
        """This step's draft length (0: no drafting) and how many of its
        `num_reqs` requests draft. `prefilling`: the step also runs prompt
        chunks (chunked prefill). `others`: expected and verified tokens of the
        step's requests that draft otherwise (lookup), sharing its verify pass."""
        self.verify_cost = self.verify_line(num_reqs)
        return self._choose(num_reqs, prefilling, others)

    def _choose(self, num_reqs: int, prefilling: bool,
                others: tuple[float, int]) -> DraftPlan:
        """choose, with the step's verify-cost line already selected."""
        self.steps += 1
        if num_reqs == 0:
            return DraftPlan(0, 0)
        probe = False
        if prefilling and len(self.verify_cost) == 0:
            # Nothing measured yet, and draft tokens would share the step's token
            # budget with prompts still being prefilled: no drafting on a guess.
            # (A server hit by many requests at once spends its first seconds
            # here; drafting K for every request then delayed every prompt.)
            k = 0
        elif len(self.draft_cost) == 0 or len(self.verify_cost) == 0 or (
            self.steps <= self.warmup_steps and self.draft_can_pay(num_reqs)
        ):
            # Nothing measured yet at this batch size: a short probe, not K.
            k, probe = min(PROBE_LENGTH, self.max_k), True
        else:
            k = self.best_length(num_reqs, others)
            if k > 0:
                self.current_probe_interval = self.probe_interval
                self.steps_since_probe = 0
            else:
                self.steps_since_probe += 1
                if self.steps_since_probe >= self.current_probe_interval:
                    # A draft no cheaper than a plain step cannot pay whatever the
                    # acceptance: the probe only has to notice a cheaper draft
                    # (a new skip set), and one draft token measures that.
                    length = PROBE_LENGTH if self.draft_can_pay(num_reqs) else 1
                    k, probe = min(length, self.max_k), True
                    self.steps_since_probe = 0
                    self.current_probe_interval = min(
                        2 * self.current_probe_interval, self.max_probe_interval
                    )
        rows = num_reqs
        if probe:
            rows = min(PROBE_ROWS * (1 + self.num_probes % 2), num_reqs)
            self.num_probes += 1
        if k > 0:
            self.steps_drafting += 1
            self.draft_length_sum += k
        else:
            self.acceptance.age(IDLE_FADE)
        return DraftPlan(k, rows)

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "drafting_fraction": self.steps_drafting / self.steps if self.steps else 0.0,
            "mean_draft_length": (
                self.draft_length_sum / self.steps_drafting if self.steps_drafting else 0.0
            ),
            "acceptance_by_position": [round(float(r), 3) for r in self.acceptance.rates()],
            "lookup_steps": self.lookup_steps,
            "mean_lookup_length": (
                self.lookup_length_sum / self.lookup_steps if self.lookup_steps else 0.0
            ),
            "lookup_acceptance_by_position": [
                round(float(r), 3) for r in self.lookup_acceptance.rates()
            ],
            "continuation_steps": self.continuation_steps,
            # Per batch-size bucket: a plain step's verify seconds, what each
            # more token costs it and what a step that verifies drafts pays on
            # top of its tokens (VerifyCost); a draft pass for that many
            # requests. What the decision weighs, for a reader of the status.
            "verify_ms": {
                bucket: {"plain": round(1000 * (line.predict(bucket) or 0.0), 1),
                         "per_token": round(1000 * line.per_token, 2),
                         "drafting_price": round(1000 * line.drafting_price, 1)}
                for bucket, line in sorted(self.verify_costs.items()) if len(line)
            },
            "draft_ms": {
                bucket: round(1000 * self.draft_cost.predict(bucket), 1)
                for bucket in sorted(self.verify_costs) if len(self.draft_cost)
            },
        }
