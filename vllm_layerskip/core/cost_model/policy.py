"""The decision: each step's draft source and length, for the most tokens per second.

A step that drafts k tokens per request costs k draft forwards plus one verify
pass over the batch's tokens, and yields, per request, 1 + sum_{j<=k} prod_{i<=j} a_i
tokens in expectation, where a_i is the conditional acceptance rate of draft
position i (vLLM stops at the first rejected draft). k = 0 is plain decoding.
Costs and rates, measured while serving (verify_cost.py, estimators.py): a
verify line per batch-size bucket (on Qwen2.5-Coder-1.5B, 2-core CPU, 9 tokens of
one request cost ~1.07 steps of 1, 8 tokens of eight requests 1.75: not one line
across batch sizes), a draft-forward cost per row bucket, and per-position
acceptance of self-drafts and of copies.

Sources, compared by one routine (estimators.argmax_length): nothing, a copy
from the context (prompt lookup: costs only its verification), a self-draft
(k draft forwards), and a copy that runs out continued by a self-draft. Where
requests have copies, the step's plan with copies is weighed against every
request self-drafting, so a cheap, well-accepted self-draft (int4 weights) is
not passed over for a short copy.

While drafting does not pay it stays off, and the policy probes now and then with
a short draft for a few of the batch's requests to keep the estimates fresh; the
probe interval doubles while probes keep confirming "off", but only once the
draft cost at that size rests on MIN_DRAFT_SAMPLES samples: a probe is one
observation, not a verdict. A draft forward that costs as much as a plain step
cannot pay at any acceptance rate (draft_can_pay): then the probes draft one
token, enough to notice a draft that got cheaper. Every probe, of self-drafts
or of copies, also waits until its expected loss is PROBE_SHARE of the time
since the last one (_probe_spacing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vllm_layerskip.core.cost_model.continuation import best_continuation
from vllm_layerskip.core.cost_model.estimators import (
    DraftCost,
    PositionAcceptance,
    PredictionCheck,
    argmax_length,
    expected_tokens,
)
from vllm_layerskip.core.cost_model.summary import policy_summary
from vllm_layerskip.core.cost_model.verify_cost import VerifyCost

# Draft length of the first steps and of the probes while drafting is off: the
# first positions' acceptance decides whether any length pays, and a short draft
# costs little where none does (a server's first steps under load drafted K for
# every request). Longer drafts follow once these pay (PositionAcceptance.rates).
PROBE_LENGTH = 2
# Requests a probe (or a first step) drafts for: the others decode plainly that
# step. A probe refreshes the estimates, it need not gain tokens: at 58 requests on
# the 2-core CPU a probe step drafting for all of them cost several plain steps
# (benchmarks/load_test.py). Probes alternate between PROBE_ROWS and twice that
# many, so the draft cost line (flat on a GPU, steep on a CPU) is measured at two
# sizes; the rows rotate (core/proposer.py): no request's text dominates.
PROBE_ROWS = 4
# While self-drafts are off, their acceptance evidence fades by this factor per
# step, so the next probe speaks for the text being written now. Without it a
# probe weighed 1 against ~50 older observations and drafting that turned off in
# a hard request stayed off through the next, easier ones (simulated: 48-step
# requests alternating acceptance 0.3-0.85, draft 0.47 of a step: 0.985-1.049x
# plain without fading, 1.025-1.068x at 0.95; tests/unit/test_cost_model.py).
IDLE_FADE = 0.95
# Timing noise on a CPU only ever adds time (another process, the OS, first calls):
# a draft pass this many times faster than earlier samples of its size shows they
# were slowed, or that the draft got cheaper (a new skip set): they are dropped.
DRAFT_RESTART = 2.0
# Probes in a row that find drafting off before probes space out: until then a
# probe comes every probe_interval steps, so that the decision to stop drafting
# rests on that many fresh draft-cost samples, not on the first passes. Three
# slow first passes (2.5x, first calls) kept a self-draft that pays off for a
# whole simulated run in 6 of 8 seeds when probes doubled their interval from
# the first one (tests/unit/test_cost_model.py).
MIN_DRAFT_SAMPLES = 4
# A probe (self-draft or copy) comes every probe_interval steps, or less often
# where its expected loss against plain decoding would exceed this share of the
# time between probes. At batch 1 a probe costs a few percent of a step, so they
# stay at probe_interval; under vllm serve at 16 requests a copy probe verified
# ~12 more tokens at ~21-35 ms each beside a 455 ms step (serve_20261207-043147),
# and at 8 requests a clasp probe (2 tokens for 4 or 8 of them) cost ~0.8-1.1
# plain steps for its accepted tokens (interleaved_20261207-125330: 8 probes in
# 132 steps, decode steps 0.95x paused): every 16 steps that was 2-6% of the time.
# A self-draft probe is priced at half its cheapest recent pass
# (_probe_draft_seconds): the first passes may be that slow, and a price read
# from them must not keep away the probes that would correct it.
PROBE_SHARE = 0.01


class DraftPlan(NamedTuple):
    """One step's decision: `length` tokens (0: no drafting) for at most `rows`
    of the step's requests."""

    length: int
    rows: int


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
        # One verify-cost line per batch-size bucket (verify_line).
        self.verify_costs: dict[int, VerifyCost] = {}
        self.draft_cost = DraftCost()
        # Per batch-size bucket: drafting steps' verify seconds and draft
        # forwards' seconds, predicted against measured (summary()).
        self.verify_checks: dict[int, PredictionCheck] = {}
        self.draft_checks: dict[int, PredictionCheck] = {}
        self.steps_since_lookup_probe = 0
        self.steps_since_probe = 0
        self.current_probe_interval = self.probe_interval
        self.probes_off = 0  # probes since drafting last paid
        self.num_probes = 0  # first steps included
        # Counters for the status (summary()).
        self.steps = 0
        self.steps_drafting = 0
        self.draft_length_sum = 0
        self.lookup_steps = 0
        self.lookup_length_sum = 0
        self.lookup_steps_prefilling = 0  # of those, steps that also ran prompt chunks
        self.continuation_steps = 0  # steps that continued copies with a self-draft
        self.copies_passed_over = 0  # steps whose copies gave way to self-drafts
        self._last_bucket = 1

    # ---- what was measured ---------------------------------------------------

    def verify_line(self, num_reqs: int) -> VerifyCost:
        """The verify-cost line of steps with `num_reqs` requests: one per
        power of two (1, 2, 3-4, 5-8, ...). A bucket with no samples yet makes
        the policy probe before it drafts there."""
        bucket = 1 << (max(int(num_reqs), 1) - 1).bit_length()
        line = self.verify_costs.get(bucket)
        if line is None:
            line = self.verify_costs[bucket] = VerifyCost()
        return line

    @property
    def verify_cost(self) -> VerifyCost:
        """The line of the batch size last planned (for the status and tests)."""
        return self.verify_line(self._last_bucket)

    def observe_verify(self, num_tokens: int, seconds: float, num_reqs: int) -> None:
        """A verify step of `num_tokens` tokens over `num_reqs` requests took
        `seconds`. A decode step schedules one token per request plus its
        drafts: more tokens than requests is a step that verified drafts."""
        line = self.verify_line(num_reqs)
        drafting = num_tokens > num_reqs
        predicted = line.predict(num_tokens, drafting)
        # A gap far longer than predicted is the engine idling between requests,
        # not the cost of the step.
        if predicted is not None and len(line) >= 8 and seconds > 5 * predicted:
            return
        if drafting and predicted is not None:
            self.verify_checks.setdefault(DraftCost.bucket_of(num_reqs), PredictionCheck()).add(
                predicted, seconds)
        line.add(num_tokens, seconds, drafting)

    def observe_draft(self, num_rows: float, seconds_per_forward: float) -> None:
        """A draft forward for `num_rows` rows took `seconds_per_forward`."""
        if len(self.draft_cost):
            self.draft_checks.setdefault(DraftCost.bucket_of(num_rows), PredictionCheck()).add(
                self.draft_cost.predict(num_rows), seconds_per_forward)
        self.draft_cost.drop_slower(num_rows, DRAFT_RESTART * seconds_per_forward)
        self.draft_cost.add(num_rows, seconds_per_forward)

    def observe_acceptance(self, num_drafted: int, num_accepted: int, lookup: bool = False) -> None:
        (self.lookup_acceptance if lookup else self.acceptance).observe(num_drafted, num_accepted)

    # ---- the decision --------------------------------------------------------

    def _self_draft(self, line: VerifyCost, num_reqs: int,
                    others: tuple[float, int] = (0.0, 0)) -> tuple[int, float]:
        """(k, tokens per second) of num_reqs requests self-drafting k tokens
        each; `others`: expected and verified tokens of the step's requests that
        draft otherwise (copies), which share the verify pass."""
        other_tokens, other_verified = others
        draft = self.draft_cost.predict(num_reqs)
        return argmax_length(
            self.acceptance.rates(),
            lambda k: k * draft + line.predict(num_reqs * (1 + k) + other_verified,
                                               drafting=k > 0 or other_verified > 0),
            num_reqs + other_tokens, num_reqs, self.margin)

    def best_length(self, num_reqs: int, others: tuple[float, int] = (0.0, 0)) -> int:
        """The self-draft length of the step (0: plain decoding), K with nothing
        measured yet."""
        line = self.verify_line(num_reqs)
        if not len(line) or not len(self.draft_cost):
            return self.max_k
        return self._self_draft(line, num_reqs, others)[0]

    def throughput(self, k: int, num_reqs: int) -> float | None:
        """Expected tokens per second of a step drafting k tokens per request."""
        line = self.verify_line(num_reqs)
        verify = line.predict(num_reqs * (1 + k), drafting=k > 0)
        draft = self.draft_cost.predict(num_reqs) if k > 0 else 0.0
        if verify is None or draft is None:
            return None
        return num_reqs * expected_tokens(self.acceptance.rates(), k) / (k * draft + verify)

    def lookup_length(self, num_reqs: int, num_lookup: int) -> int:
        """Tokens each of the `num_lookup` requests with a copy drafts this
        step, if the other requests decoded plainly (a copy costs only its
        verification). 0: no copies; every probe interval they try PROBE_LENGTH
        again, so a stream that starts copying is noticed."""
        return self._lookup_choice(num_reqs, num_lookup)[0]

    def _lookup_choice(self, num_reqs: int, num_lookup: int) -> tuple[int, bool]:
        """(lookup_length, whether that length is a probe)."""
        line = self.verify_line(num_reqs)
        if len(line) == 0:
            return min(PROBE_LENGTH, self.max_k), True
        best_k, _ = argmax_length(
            self.lookup_acceptance.rates(),
            lambda k: line.predict(num_reqs + num_lookup * k, drafting=k > 0),
            num_reqs, num_lookup, self.margin)
        if best_k:
            self.steps_since_lookup_probe = 0
            return best_k, False
        self.steps_since_lookup_probe += 1
        length = min(PROBE_LENGTH, self.max_k)
        if (self.steps_since_lookup_probe >= self.probe_interval and self.steps_since_lookup_probe
                >= self._probe_spacing(line, num_reqs, num_lookup, length, 0.0,
                                       self.lookup_acceptance.rates())):
            self.steps_since_lookup_probe = 0
            return length, True
        return 0, False

    def _probe_spacing(self, line: VerifyCost, num_reqs: int, rows: int, length: int,
                       draft_seconds: float, rates: np.ndarray,
                       base_tokens: int | None = None) -> float:
        """Steps between probes of `length` tokens for `rows` of a step's
        `num_reqs` requests (each draft token `draft_seconds`, 0 for a copy;
        accepted at `rates`) at which a probe's expected loss against the step
        without it is PROBE_SHARE of the time between them. `base_tokens`: what
        the step verifies without the probe (default one token a request; more:
        copies, which have paid the price of a drafting step already). A line
        that has seen one size only prices extra tokens by proportion (too dear
        on a GPU): no spacing."""
        if line.single_size is not None:
            return 0.0
        base = num_reqs if base_tokens is None else base_tokens
        plain = line.predict(num_reqs)
        gained = rows * (expected_tokens(rates, length) - 1)
        loss = (length * draft_seconds + line.predict(base + rows * length, drafting=True)
                - line.predict(base, drafting=base > num_reqs) - plain * gained / num_reqs)
        return min(loss / (PROBE_SHARE * plain), self.max_probe_interval)

    def _probe_draft_seconds(self, rows: int) -> float:
        """The price of a self-draft probe's draft forward for `rows` rows: the
        cheapest recent pass of that size over DRAFT_RESTART. A probe is there
        to find a draft cheaper than the estimate (first passes slowed, a new
        skip set), and a pass that much faster would restart the estimate."""
        return self.draft_cost.cheapest(rows) / DRAFT_RESTART

    def continuation_length(self, num_reqs: int, self_plan: tuple[int, int],
                            copy_lengths: np.ndarray, run_out_lengths: np.ndarray) -> int:
        """Self-draft tokens that continue the copied drafts which ran out
        (`run_out_lengths`: their m copied tokens each), 0: none; the step also
        verifies the other copied drafts (`copy_lengths`) and `self_plan` =
        (length, requests) of self-drafts (core/cost_model/continuation.py)."""
        line = self.verify_line(num_reqs)
        if not len(run_out_lengths) or len(self.draft_cost) == 0 or len(line) == 0:
            return 0  # nothing measured yet: no continuation on a guess
        best_j = best_continuation(
            line, self.draft_cost.predict, self.acceptance.rates(),
            self.lookup_acceptance.rates(), num_reqs, self_plan, copy_lengths,
            run_out_lengths, self.margin, self.max_k)
        self.continuation_steps += best_j > 0
        return best_j

    def draft_can_pay(self, num_reqs: int, line: VerifyCost | None = None) -> bool:
        """Whether some draft length could beat plain decoding at this batch
        size if every draft token were accepted. Verifying never costs less than
        a plain step v, so k drafts of d seconds each gain at most k tokens for
        k*d more seconds: the speedup is at most (1 + k) / (1 + k*d/v), below 1
        for d >= v. Where a cost is known at one size only, d and v are read
        at the side of that size that cannot overstate d/v (proportional
        extrapolation would: up for d, down for v). `line`: the step's verify
        line (default: that of num_reqs requests)."""
        line = self.verify_line(num_reqs) if line is None else line
        size = self.draft_cost.single_size
        draft = self.draft_cost.predict(num_reqs if size is None else min(num_reqs, size))
        size = line.single_size
        plain = line.predict(num_reqs if size is None else max(num_reqs, size))
        if draft is None or plain is None:
            return True
        k = self.max_k
        return (1 + k) / (1 + k * draft / plain) > 1 + self.margin

    def _measured(self, num_reqs: int) -> bool:
        return (len(self.draft_cost) > 0 and len(self.verify_line(num_reqs)) > 0
                and self.steps >= self.warmup_steps)

    def choose_with_lookup(self, num_reqs: int, prefilling: bool,
                           num_lookup: int) -> tuple[int, DraftPlan]:
        """(copy length, plan): the draft length of the `num_lookup` requests
        that have a copy (core/lookup.py; 0: they self-draft like the others),
        and the plan of the requests that self-draft."""
        self._last_bucket = num_reqs
        line = self.verify_line(num_reqs)
        lookup, probe = 0, False
        if num_lookup and not (prefilling and len(line) == 0):
            lookup, probe = self._lookup_choice(num_reqs, num_lookup)
        # A probe of the copies is not weighed: it refreshes their estimates.
        if not lookup:
            return 0, self._choose(num_reqs, prefilling, (0.0, 0))
        # The copies' expected and verified tokens, sharing the step's verify pass.
        rates = self.lookup_acceptance.rates()
        others = (num_lookup * expected_tokens(rates, lookup), num_lookup * (1 + lookup))
        # After a prefill nothing self-drafts (_choose), so no self-draft can win.
        if not probe and not prefilling and self._measured(num_reqs) and self._self_drafts_win(
                num_reqs, num_lookup, lookup, others):
            self.copies_passed_over += 1
            return 0, self._choose(num_reqs, prefilling, (0.0, 0))
        self.lookup_steps += 1
        self.lookup_length_sum += lookup
        self.lookup_steps_prefilling += prefilling
        return lookup, self._choose(num_reqs - num_lookup, prefilling, others)

    def _self_drafts_win(self, num_reqs: int, num_lookup: int, lookup: int,
                         others: tuple[float, int]) -> bool:
        """Whether every request self-drafting beats the copies (at `lookup`
        tokens, `others` their expected and verified tokens) with the other
        requests self-drafting."""
        line = self.verify_line(num_reqs)
        rest = num_reqs - num_lookup
        if rest:
            _, with_copies = self._self_draft(line, rest, others)
        else:  # copies alone
            with_copies = others[0] / line.predict(
                num_reqs + num_lookup * lookup, drafting=True)
        k, all_self = self._self_draft(line, num_reqs)
        return k > 0 and all_self > with_copies * (1 + self.margin)

    def choose(self, num_reqs: int, prefilling: bool = False,
               others: tuple[float, int] = (0.0, 0)) -> DraftPlan:
        """This step's draft length (0: no drafting) and how many of its
        `num_reqs` requests draft. `prefilling`: the step also runs prompt
        chunks (chunked prefill). `others`: expected and verified tokens of the
        step's requests that draft otherwise (copies), sharing its verify pass."""
        self._last_bucket = num_reqs
        return self._choose(num_reqs, prefilling, others)

    def _choose(self, num_reqs: int, prefilling: bool,
                others: tuple[float, int]) -> DraftPlan:
        self.steps += 1
        if num_reqs == 0:
            return DraftPlan(0, 0)
        if prefilling:
            # The first tokens of the prompts just prefilled leave only after this
            # step's draft passes (TTFT p50 1.6x plain's with them, 1.01x without:
            # benchmarks/results/2026-12-03/serve_*.md). Copies still run.
            return DraftPlan(0, 0)
        line = self.verify_line(self._last_bucket)
        probe = False
        rows = num_reqs
        probe_rows = min(PROBE_ROWS * (1 + self.num_probes % 2), num_reqs)
        if len(self.draft_cost) == 0 or len(line) == 0:
            # Nothing measured yet at this batch size: a short probe, not K.
            k, probe = min(PROBE_LENGTH, self.max_k), True
        else:
            # The first steps probe each step, the later ones every probe
            # interval, each no more often than its price allows.
            warm = self.steps <= self.warmup_steps and self.draft_can_pay(num_reqs, line)
            k = 0 if warm else self._self_draft(line, num_reqs, others)[0]
            if k > 0:
                self.current_probe_interval = self.probe_interval
                self.steps_since_probe = 0
                self.probes_off = 0
            else:
                self.steps_since_probe += 1
                # A draft no cheaper than a plain step cannot pay whatever the
                # acceptance: the probe only has to notice a cheaper draft
                # (a new skip set), and one draft token measures that.
                length = min(PROBE_LENGTH if warm or self.draft_can_pay(num_reqs, line)
                             else 1, self.max_k)
                interval = 1 if warm else self.current_probe_interval
                if self.steps_since_probe >= interval and self.steps_since_probe >= \
                        self._probe_spacing(line, self._last_bucket, probe_rows, length,
                                            self._probe_draft_seconds(probe_rows),
                                            self.acceptance.rates(),
                                            num_reqs + others[1]):
                    k, probe = length, True
                    self.steps_since_probe = 0
                    if not warm:
                        self.probes_off += 1
                        if self.probes_off >= MIN_DRAFT_SAMPLES:
                            self.current_probe_interval = min(
                                2 * self.current_probe_interval, self.max_probe_interval)
        if probe:
            rows = probe_rows
            self.num_probes += 1
        if k > 0:
            self.steps_drafting += 1
            self.draft_length_sum += k
        else:
            self.acceptance.age(IDLE_FADE)
        return DraftPlan(k, rows)

    def summary(self) -> dict:
        """What the policy decided and what it weighs, for the status."""
        return policy_summary(self)
