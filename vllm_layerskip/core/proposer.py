"""What every layer-skip proposer shares: construction from the vLLM config, the
draft engine, the draft-length cost model, the failure boundary around each
draft pass, and the entry point the model-runner patch calls."""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from vllm_layerskip.core.cost_model import DraftLengthPolicy
from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult, empty_probs, write_one_hot
from vllm_layerskip.core.draft_engine import DraftEngine
from vllm_layerskip.core.failure_boundary import draft_or_nothing
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.load_checks import (
    check_draft_weights,
    draft_weights_status,
    warn_if_bf16_cannot_pay,
)
from vllm_layerskip.core.lookup import PromptLookup
from vllm_layerskip.core.measure import DRAFTING_PAUSED_ENV, drafting_paused_at_start
from vllm_layerskip.core.rank_agreement import rank_agreement
from vllm_layerskip.core.selection import get_selection
from vllm_layerskip.core.proposer_stats import ProposerStats, RequestBookkeeping, StatusReports
from vllm_layerskip.core.step_plan import (
    StepPlan, copy_plan, has_copy, plan_step, probe_rows, stopped_drafts)
from vllm_layerskip.core.suffix_copies import SuffixTreeCopies

logger = logging.getLogger("vllm.layerskip")



class SelfDraftProposer:
    """A drafter whose draft is the target model itself: some sub-layers
    skipped, its weights read at 4 bits, or an early exit (the method says).

    vLLM builds it from `speculative_config.model` (the `custom_class` path),
    calls `load_model(target_model)` once, and, through patches/model_runner.py,
    `propose_from_runner(...)` after every step that sampled tokens. Subclasses
    implement `draft(runner, requests)`.
    """

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        selection = get_selection(spec)
        if selection is None:
            raise RuntimeError(
                f"{type(self).__name__} is built by the vllm-layerskip plugin from a "
                "speculative config with a layer-skip 'method'; it cannot be named as "
                "a custom_class model directly. Use e.g. "
                '{"method": "layer_skip", "num_speculative_tokens": 4}.'
            )
        self.vllm_config = vllm_config
        self.method = selection.method
        self.options = selection.options
        self.num_speculative_tokens = spec.num_speculative_tokens
        self.engine = DraftEngine(vllm_config, spec.num_speculative_tokens)
        self.policy = (
            DraftLengthPolicy(spec.num_speculative_tokens, self.options.probe_interval)
            if self.options.adaptive_draft_length
            else None
        )
        self.stats = ProposerStats()
        # Tensor parallelism: decisions taken from rank-local inputs (time,
        # threads) are rank 0's on every rank (rank_agreement.py).
        self.agreement = rank_agreement()
        # What the last call drafted, to learn acceptance and verify cost from the
        # step that verified it: req id -> (tokens copied from the context, tokens
        # self-drafted after them). Both non-zero: a self-draft continuing a copy.
        self._last_drafted: dict[str, tuple[int, int]] = {}
        self._stopped: set[str] = set()  # of those, self-drafts cut before their budget
        self._last_end: float | None = None
        self._probe_offset = 0  # where the next probe's rows start in the batch
        self.bookkeeping = RequestBookkeeping()
        self.reports = StatusReports()
        # set_drafting_paused(): steps decode as plain decoding, learning nothing.
        # A server started with DRAFTING_PAUSED_ENV=1 starts paused (core/measure.py).
        self.drafting_paused = drafting_paused_at_start()
        if self.drafting_paused:
            logger.warning("vllm-layerskip %s: drafting paused from the start (%s=1): every "
                           "step decodes as plain decoding", self.method, DRAFTING_PAUSED_ENV)
        # set_prompt_lookup_paused(): the method self-drafts alone (no copies).
        self.prompt_lookup_paused = False
        # Where copied drafts come from (None: no copies).
        self.copies = (SuffixTreeCopies() if self.options.copy_source == "suffix_tree" else
                       PromptLookup(self.options.prompt_lookup_max, self.options.prompt_lookup_min)
                       if self.options.prompt_lookup_max else None)

    def load_model(self, target_model) -> None:
        identity = model_identity(self.vllm_config.model_config)
        warn_if_bf16_cannot_pay(self.method, self.vllm_config)
        self.engine.load_model(target_model, self.options.draft_token_ids(identity))
        if self.engine.head.pruned:
            logger.info("vllm-layerskip %s: drafts score %d of %d token ids (draft vocabulary %s)",
                        self.method, self.engine.head.token_ids.numel(), identity.vocab_size,
                        self.options.draft_vocab or "shipped")
        check_draft_weights(self.method, self.options.draft_weights, self.engine)
        self.on_model_loaded()

    def on_model_loaded(self) -> None:
        """Hook for subclasses: the model's layer count is known from here on."""

    def propose(self, *args, **kwargs):
        # vLLM's custom_class loader requires this method; the runner patch calls
        # propose_from_runner instead, which gets the runner's state.
        raise RuntimeError(
            "vllm-layerskip proposers are called through the plugin's model-runner "
            "patch; was the plugin loaded (vllm.general_plugins entry point)?"
        )

    def draft(self, runner, requests: DraftRequests) -> DraftResult:
        raise NotImplementedError

    def before_draft(self, runner, requests: DraftRequests) -> None:
        """Hook for subclasses: work done each step before drafting (e.g. an
        optimization step), kept out of the measured draft cost."""

    def on_verified(self, num_drafted: int, num_accepted: int) -> None:
        """Hook for subclasses: how many of last step's draft tokens were accepted."""

    def set_drafting_paused(self, paused: bool) -> None:
        """Pause (True) or resume drafting. While paused every step decodes as plain
        decoding in this same engine, and neither the cost model nor the method
        learns from it. For benchmarks: plain decoding in the method's own engine
        is a baseline on the same memory, where two plain engines can differ by
        more than a method gains (up to 42% on a Xeon VM; benchmarks/bench_interleaved.py)."""
        self.drafting_paused = bool(paused)
        self._last_drafted = {}
        self._last_end = None  # no step time across the pause
        self.on_drafting_paused()

    def on_drafting_paused(self) -> None:
        """Hook for subclasses: drafting was paused or resumed
        (set_drafting_paused); a method's clock-based state must not count
        the paused steps as its own."""

    def set_prompt_lookup_paused(self, paused: bool) -> bool:
        """Pause (True) or resume copies (prompt lookup or the suffix tree):
        paused, the method drafts as it would without them, and the cost model's
        lookup estimates wait unchanged. For benchmarks: the method alone and the
        hybrid in one engine (benchmarks/bench_interleaved.py). Returns False
        where this engine copies nothing, so that there is nothing to pause."""
        if self.copies is None:
            return False
        self.prompt_lookup_paused = bool(paused)
        return True

    def propose_from_runner(
        self, runner, sampled_token_ids: list[list[int]], scheduler_output=None
    ) -> DraftResult:
        if self.drafting_paused:
            return DraftResult.none(len(runner.input_batch.req_ids))
        start = time.perf_counter()
        self._observe_verified_step(runner, sampled_token_ids, scheduler_output, start)
        requests = self.engine.select_requests(runner, sampled_token_ids)
        method_start = time.perf_counter()
        self.before_draft(runner, requests)
        method_seconds = time.perf_counter() - method_start
        room = requests.budget  # draft tokens each request has room for
        copied = self._lookup(runner, requests)  # [num_drafting] drafts from the context
        decision = self._decide(requests, copied, room, scheduler_output)
        req_ids = runner.input_batch.req_ids
        if decision[0] or decision[1]:
            result, draft_seconds = self._draft_step(runner, requests, copied, room, decision)
        else:
            # Plain decoding this step (no copy, no self-draft): no plan and no
            # pass to set up. Such a step cost the proposer 0.33-0.37 ms on
            # SmolLM2 here (1.2-1.4% of a plain step), 0.17-0.20 ms with this,
            # the lookup's byte search and select_requests' per-row reads.
            result, draft_seconds = DraftResult.none(len(req_ids)), 0.0
            self._last_drafted = {}
        self.stats.record(result, draft_seconds,
                          sum(c for c, _ in self._last_drafted.values()))
        self.bookkeeping.observe(req_ids, self.tracked_request_ids())
        self.reports.after_step(self.method, self.status, self.agreement.is_leader)
        self._last_end = time.perf_counter()
        self.stats.propose_seconds += self._last_end - start
        if not self._last_drafted:
            self.stats.record_nothing_drafted(self._last_end - start, result.num_forward_steps > 0,
                                              method_seconds)
        return result

    def _draft_step(self, runner, requests: DraftRequests, copied, room,
                    decision) -> tuple[DraftResult, float]:
        """The step's plan carried out: copies placed, the self-draft pass run
        (timed, for the cost model), and what each request drafted kept to
        learn from its verification. (result, seconds of the draft pass)"""
        plan = plan_step(copied, room, *decision)
        requests = dataclasses.replace(requests, budget=plan.self_budget, prefix=plan.prefix)
        draft_start = time.perf_counter()
        result = draft_or_nothing(self.draft, runner, requests, self.stats, self.method,
                                  self.num_speculative_tokens)
        draft_seconds = time.perf_counter() - draft_start
        if self.policy is not None and result.num_forward_steps:
            rows_per_step = result.num_rows_run / result.num_forward_steps
            self.policy.observe_draft(rows_per_step, draft_seconds / result.num_forward_steps)
        copied_rows = self._add_copies(runner, requests, result, copied, plan)
        num_copied = dict.fromkeys(copied_rows, None)
        for i, prefix in enumerate(plan.prefix or ()):
            if len(prefix):
                num_copied[int(requests.rows[i])] = len(prefix)
        req_ids = runner.input_batch.req_ids
        self._last_drafted = {}
        for row, tokens in enumerate(result.token_ids):
            if tokens:
                n = num_copied.get(row, 0)
                n = len(tokens) if n is None else n  # None: the whole draft was copied
                self._last_drafted[req_ids[row]] = (n, len(tokens) - n)
        empty, short = (stopped_drafts(plan, requests.rows, result.token_ids)
                        if result.num_forward_steps else ([], []))  # none if it failed
        self._stopped = {req_ids[int(requests.rows[i])] for i in short}
        self.stats.num_empty_drafts += len(empty)
        for _ in empty if self.policy is not None else ():
            # Nothing to verify: the first position yielded nothing. Uncounted,
            # adadecode's passes without a confident exit head went on drafting.
            self.policy.observe_acceptance(1, 0)
        return result, draft_seconds

    def _decide(self, requests: DraftRequests, copied, room, scheduler_output):
        """(copy length, self-draft length, which requests self-draft or None
        for all, self-draft tokens continuing copies that run out): the cost
        model's choice, rank 0's under tensor parallelism (it learns from this
        rank's clock; every rank must run the same draft forwards); fixed K
        without the cost model."""
        k = self.num_speculative_tokens
        # Python ints and lists up to where a plan needs arrays: this runs every
        # step, most of them drafting nothing (each numpy call ~1-5 us here).
        num_copies = sum(len(c) > 0 for c in copied)
        if self.policy is None or not len(requests.rows):
            return (k if num_copies else 0), k, None, (k if self.continues_copies else 0)
        lookup_length, decision, continue_length = self.agreement.share(
            self._plan_step(requests, copied, num_copies, room, scheduler_output))
        num_self = len(copied) - num_copies if lookup_length else len(copied)
        chosen = None
        if decision.length and decision.rows < num_self:
            # A probe drafts for a few of the requests; which ones rotates.
            # (The offset counts shared plans only, so it agrees across ranks.)
            self_rows = ~has_copy(copied) if lookup_length else np.ones(len(copied), dtype=bool)
            chosen, self._probe_offset = probe_rows(self._probe_offset, self_rows, decision.rows)
        return lookup_length, decision.length, chosen, continue_length

    def _plan_step(self, requests: DraftRequests, copied, num_copies: int, room,
                   scheduler_output):
        """The cost model's plan for this step: (lookup length, the self-drafting
        requests' plan, self-draft tokens continuing copies that run out)."""
        lookup_length, plan = self.policy.choose_with_lookup(
            len(requests.rows), self._ran_prompt_chunks(scheduler_output), num_copies)
        if not lookup_length or not self.continues_copies:
            return lookup_length, plan, 0
        found = has_copy(copied)
        copy_budget, runs_out = copy_plan(copied, room, lookup_length)
        lengths = np.array([len(c[:b]) for c, b in zip(copied, copy_budget)], dtype=np.int64)
        num_self = min(plan.rows, int((~found).sum())) if plan.length else 0
        return lookup_length, plan, self.policy.continuation_length(
            len(requests.rows), (plan.length, num_self), lengths[found & ~runs_out],
            lengths[runs_out])

    @property
    def continues_copies(self) -> bool:
        """Whether a copied draft that runs out may go on as a self-draft (with
        prompt lookup on). Early-exit drafts (adadecode) cannot: they write no
        K/V above their exit layer, which a copied token's later readers need."""
        return self.copies is not None

    def _lookup(self, runner, requests: DraftRequests) -> list[np.ndarray]:
        """Each drafting request's copied draft (core/lookup.py or
        core/suffix_copies.py; empty without a match, or when copies are off)."""
        if self.copies is None or self.prompt_lookup_paused:
            return [np.zeros(0, dtype=np.int64)] * len(requests.rows)
        # Called with no row drafting too: the suffix trees follow the batch.
        return self.copies.drafts(runner.input_batch, requests.rows, requests.budget)

    def _add_copies(self, runner, requests, result: DraftResult, copied,
                    plan: StepPlan) -> set[int]:
        """Put the copied drafts into the step's result (input-batch rows). A
        copied token is a draft from a one-hot q (draft_engine.write_one_hot)."""
        rows = set()
        for i in np.flatnonzero(plan.copying):
            tokens = copied[i][: plan.copy_budget[i]].tolist()
            if not tokens:
                continue
            row = int(requests.rows[i])
            result.token_ids[row] = tokens
            result.top1_probs[row] = [1.0] * len(tokens)
            rows.add(row)
            if requests.temperature[i] > 0:
                if result.probs is None:
                    result.probs = empty_probs(runner, self.num_speculative_tokens)
                write_one_hot(result.probs, row, tokens)
        return rows

    def _ran_prompt_chunks(self, scheduler_output) -> bool:
        """Whether the step just run also processed prompt chunks (more tokens for
        a request than a verify step has): its cost is not a verify step's."""
        if scheduler_output is None:
            return False
        per_request = scheduler_output.num_scheduled_tokens.values()
        return bool(per_request) and max(per_request) > 1 + self.num_speculative_tokens

    def _observe_verified_step(self, runner, sampled_token_ids, scheduler_output, now) -> None:
        """Learn from the step that just verified our last drafts."""
        req_ids = runner.input_batch.req_ids
        total_drafted = total_accepted = 0
        for row, sampled in enumerate(sampled_token_ids[: len(req_ids)]):
            copied, drafted = self._last_drafted.get(req_ids[row], (0, 0))
            if not (copied or drafted) or not sampled:
                continue
            accepted = min(len(sampled) - 1, copied + drafted)
            if copied:
                self.stats.record_verified(copied, min(accepted, copied), "lookup")
                if self.policy is not None:
                    self.policy.observe_acceptance(copied, min(accepted, copied), lookup=True)
            # Self-drafted tokens after a copy were verified only if all of the
            # copy was accepted: only then do they say how good the draft is.
            if drafted and accepted >= copied:
                accepted -= copied
                self.stats.record_verified(drafted, accepted,
                                           "continuation" if copied else "self")
                if self.policy is not None:  # a chain that stopped short: rejected there
                    self.policy.observe_acceptance(
                        drafted + (req_ids[row] in self._stopped), accepted)
                total_drafted += drafted  # the method learns from its own drafts only
                total_accepted += accepted
        if total_drafted:
            self.on_verified(total_drafted, total_accepted)
        if self.policy is None or scheduler_output is None or self._last_end is None:
            return
        # Steps that also ran a prompt chunk cost differently per token than
        # decode/verify steps; only the latter describe drafting's cost.
        if scheduler_output.num_scheduled_tokens and not self._ran_prompt_chunks(scheduler_output):
            self.policy.observe_verify(
                scheduler_output.total_num_scheduled_tokens, now - self._last_end,
                num_reqs=len(scheduler_output.num_scheduled_tokens),
            )

    @property
    def self_drafted_last_step(self) -> bool:
        """Whether the last step ran a draft pass (lookup drafts do not)."""
        return any(drafted for _, drafted in self._last_drafted.values())

    @property
    def self_drafts_in_use(self) -> bool:
        """Whether self-drafts paid at the cost model's last decision about them
        (or there is no cost model): false from the first probe that finds they
        do not, until one finds they do."""
        return self.policy is None or self.policy.probes_off == 0

    def tracked_request_ids(self) -> set[str]:
        """Ids of the requests this proposer holds state for. vLLM drops finished
        and aborted requests from the input batch, and so must the proposer: a
        subclass that keeps per-request state adds its ids here, and the status
        shows any id kept beyond the batch."""
        return set(self._last_drafted) | (self.copies.request_ids if self.copies else set())

    def status(self) -> dict:
        status = self.stats.as_dict()
        head = self.engine.head
        status["draft_vocab_size"] = head.token_ids.numel() if head is not None and head.pruned else 0
        status["draft_weights"] = draft_weights_status(self.options.draft_weights, self.engine)
        status["requests"] = self.bookkeeping.as_dict()
        status["drafting_paused"] = self.drafting_paused
        status["prompt_lookup_paused"] = self.prompt_lookup_paused
        if self.policy is not None:
            status["cost_model"] = self.policy.summary()
        return status
