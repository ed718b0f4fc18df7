"""What every layer-skip proposer shares: construction from the vLLM config, the
draft engine, the draft-length cost model, the failure boundary around each
draft pass, and the entry point the model-runner patch calls."""

from __future__ import annotations

import logging
import math
import os
import time

import numpy as np

from vllm_layerskip.core.cost_model import DraftLengthPolicy
from vllm_layerskip.core.cpu_dtype import bf16_without_arithmetic_warning, cpu_flags
from vllm_layerskip.core.draft_engine import (
    DraftEngine,
    DraftRequests,
    DraftResult,
    empty_probs,
    write_one_hot,
)
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.faults import maybe_fail
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.lookup import lookup_drafts
from vllm_layerskip.core.rank_agreement import rank_agreement
from vllm_layerskip.core.selection import get_selection
from vllm_layerskip.core.versioned_file import write_json_atomic

logger = logging.getLogger("vllm.layerskip")

LOG_INTERVAL_S = 30.0
# Debugging and load tests (benchmarks/load_test.py): the proposer's status() as JSON
# in this file, rewritten after every step (by tensor-parallel rank 0 only).
STATUS_FILE_ENV = "VLLM_LAYERSKIP_STATUS_FILE"


class LayerSkipProposerBase:
    """A drafter that runs the target model itself with some sub-layers skipped.

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
        self._last_end: float | None = None
        self._probe_offset = 0  # where the next probe's rows start in the batch
        self._last_log = time.monotonic()
        self.bookkeeping = RequestBookkeeping()
        self._status_file = os.environ.get(STATUS_FILE_ENV) or None
        # set_drafting_paused(): steps decode as plain decoding, learning nothing.
        self.drafting_paused = False
        # set_prompt_lookup_paused(): the method self-drafts alone (no copies).
        self.prompt_lookup_paused = False

    def load_model(self, target_model) -> None:
        identity = model_identity(self.vllm_config.model_config)
        self._warn_if_bf16_cannot_pay()
        self.engine.load_model(target_model, self.options.draft_token_ids(identity))
        if self.engine.head.pruned:
            logger.info("vllm-layerskip %s: drafts score %d of %d token ids (draft vocabulary %s)",
                        self.method, self.engine.head.token_ids.numel(), identity.vocab_size,
                        self.options.draft_vocab or "shipped")
        self._check_draft_weights()
        self.on_model_loaded()

    def _check_draft_weights(self) -> None:
        asked, loaded = self.options.draft_weights, self._draft_weights_status()
        if asked is not None and loaded is None:
            raise LayerSkipConfigError(
                f"'draft_weights': {asked!r} was asked for but the model's linear layers "
                "were loaded without a draft copy (was the plugin loaded in the worker "
                "before the model? vllm.general_plugins entry point)."
            )
        if loaded is not None:
            head = " and of the pruned draft head" if self.engine.head.quantized_bytes else ""
            logger.info("vllm-layerskip %s: drafts read %s copies of the linear weights%s "
                        "(%.2f GB beside the model's)", self.method, asked, head,
                        loaded["bytes"] / 1e9)

    def _draft_weights_status(self) -> dict | None:
        """The quantized copies draft passes read, None without (draft_weights)."""
        from vllm_layerskip.core.draft_weights import total_bytes

        stack = self.engine.stack
        if stack is None or stack.draft is None:
            return None
        return {"scheme": self.options.draft_weights,
                "bytes": total_bytes(stack.draft) + self.engine.head.quantized_bytes,
                "max_tokens_per_pass": stack.draft[0].max_tokens}

    def _warn_if_bf16_cannot_pay(self) -> None:
        from vllm.distributed import get_tensor_model_parallel_rank
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or get_tensor_model_parallel_rank() != 0:
            return  # one warning per engine, not one per tensor-parallel rank
        dtype = str(self.vllm_config.model_config.dtype).replace("torch.", "")
        warning = bf16_without_arithmetic_warning(dtype, cpu_flags())
        if warning:
            logger.warning("vllm-layerskip %s: %s", self.method, warning)

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
        more than a method gains (up to 42% on a Xeon VM; benchmarks/bench_paused.py)."""
        self.drafting_paused = bool(paused)
        self._last_drafted = {}
        self._last_end = None  # no step time across the pause

    def set_prompt_lookup_paused(self, paused: bool) -> bool:
        """Pause (True) or resume prompt lookup: paused, the method drafts as it
        would without `prompt_lookup_max`, and the cost model's lookup estimates
        wait unchanged. For benchmarks: the method alone and the hybrid in one
        engine (benchmarks/bench_interleaved.py). Returns False where this engine
        has prompt lookup off, so that there is nothing to pause."""
        if not self.options.prompt_lookup_max:
            return False
        self.prompt_lookup_paused = bool(paused)
        return True

    def propose_from_runner(
        self, runner, sampled_token_ids: list[list[int]], scheduler_output=None
    ) -> DraftResult:
        if self.drafting_paused:
            return _no_drafts(len(runner.input_batch.req_ids))
        start = time.perf_counter()
        self._observe_verified_step(runner, sampled_token_ids, scheduler_output, start)
        requests = self.engine.select_requests(runner, sampled_token_ids)
        self.before_draft(runner, requests)
        room = requests.budget.copy()  # draft tokens each request has room for
        copied = self._lookup(runner, requests)  # [num_drafting] drafts from the context
        has_copy = np.array([len(c) > 0 for c in copied], dtype=bool)
        lookup_length = self.num_speculative_tokens if has_copy.any() else 0
        # Self-draft tokens after a copied draft that ran out before the room
        # (its match reached the end of the context); fixed K: fill the room.
        continue_length = self.num_speculative_tokens if self.continues_copies else 0
        if self.policy is not None and len(requests.rows):
            # The cost model learns from this rank's clock; every rank must run
            # the same number of draft forwards, so rank 0's choice holds.
            lookup_length, plan, continue_length = self.agreement.share(
                self._plan_step(requests, copied, has_copy, room, scheduler_output))
            self_rows = ~has_copy if lookup_length else np.ones(len(has_copy), dtype=bool)
            requests.budget = np.minimum(requests.budget, plan.length)
            if plan.rows < self_rows.sum():
                self._limit_to_probe_rows(requests, plan.rows, self_rows)
        # Requests drafting from their context need no model pass, unless they
        # continue their copy with a self-draft.
        # (_plan_step worked out the copy plan too, but under tensor parallelism
        # the lookup length is rank 0's: each rank applies the shared one.)
        copying = has_copy if lookup_length else np.zeros_like(has_copy)
        copy_budget, runs_out = _copy_plan(copied, room, lookup_length)
        requests.budget = np.where(copying, 0, requests.budget)
        continuing = copying & runs_out if continue_length else None
        if continuing is not None and continuing.any():
            requests.prefix = [copied[i][: copy_budget[i]] if continuing[i] else copied[i][:0]
                               for i in range(len(copied))]
            for i in np.flatnonzero(continuing):
                requests.budget[i] = min(room[i], len(requests.prefix[i]) + continue_length)
            copying = copying & ~continuing
        draft_start = time.perf_counter()
        result = self._draft_or_nothing(runner, requests)
        draft_seconds = time.perf_counter() - draft_start
        if self.policy is not None and result.num_forward_steps:
            rows_per_step = result.num_rows_run / result.num_forward_steps
            self.policy.observe_draft(rows_per_step, draft_seconds / result.num_forward_steps)
        copied_rows = self._add_copies(runner, requests, result, copied, copying, copy_budget)
        num_copied = dict.fromkeys(copied_rows, None)
        for i, prefix in enumerate(requests.prefix or ()):
            if len(prefix):
                num_copied[int(requests.rows[i])] = len(prefix)
        req_ids = runner.input_batch.req_ids
        self._last_drafted = {}
        for row, tokens in enumerate(result.token_ids):
            if tokens:
                n = num_copied.get(row, 0)
                n = len(tokens) if n is None else n  # None: the whole draft was copied
                self._last_drafted[req_ids[row]] = (n, len(tokens) - n)
        self.stats.record(result, draft_seconds,
                          sum(c for c, _ in self._last_drafted.values()))
        self.bookkeeping.observe(req_ids, self.tracked_request_ids())
        self._maybe_log()
        self._maybe_write_status()
        self._last_end = time.perf_counter()
        self.stats.propose_seconds += self._last_end - start
        return result

    def _plan_step(self, requests: DraftRequests, copied, has_copy, room, scheduler_output):
        """The cost model's plan for this step: (lookup length, the self-drafting
        requests' plan, self-draft tokens continuing copies that run out)."""
        lookup_length, plan = self.policy.choose_with_lookup(
            len(requests.rows), self._ran_prompt_chunks(scheduler_output), int(has_copy.sum())
        )
        if not lookup_length or not self.continues_copies:
            return lookup_length, plan, 0
        copy_budget, runs_out = _copy_plan(copied, room, lookup_length)
        lengths = np.array([len(c[:b]) for c, b in zip(copied, copy_budget)], dtype=np.int64)
        num_self = min(plan.rows, int((~has_copy).sum())) if plan.length else 0
        return lookup_length, plan, self.policy.continuation_length(
            len(requests.rows), (plan.length, num_self), lengths[has_copy & ~runs_out],
            lengths[runs_out])

    @property
    def continues_copies(self) -> bool:
        """Whether a copied draft that runs out may go on as a self-draft (with
        prompt lookup on). Early-exit drafts (adadecode) cannot: they write no
        K/V above their exit layer, which a copied token's later readers need."""
        return bool(self.options.prompt_lookup_max)

    def _limit_to_probe_rows(self, requests: DraftRequests, num_rows: int,
                             eligible: np.ndarray | None = None) -> None:
        """A probe drafts for `num_rows` of the `eligible` requests (those
        without a lookup draft), the others decode plainly. Which ones rotates
        over the batch from probe to probe. (The offset counts shared plans
        only, so it agrees across ranks.)"""
        candidates = np.arange(len(requests.rows)) if eligible is None else np.flatnonzero(eligible)
        total = len(candidates)
        probed = candidates[(self._probe_offset + np.arange(num_rows)) % total]
        keep = np.zeros(len(requests.rows), dtype=bool)
        keep[probed] = True
        requests.budget = np.where(keep, requests.budget, 0)
        self._probe_offset = (self._probe_offset + num_rows) % total

    def _lookup(self, runner, requests: DraftRequests) -> list[np.ndarray]:
        """Each drafting request's lookup draft (core/lookup.py; empty without
        a match, or when prompt lookup is off)."""
        if (not self.options.prompt_lookup_max or self.prompt_lookup_paused
                or not len(requests.rows)):
            return [np.zeros(0, dtype=np.int64)] * len(requests.rows)
        batch = runner.input_batch
        return lookup_drafts(batch.token_ids_cpu, batch.num_tokens_no_spec, requests.rows,
                             self.options.prompt_lookup_max, self.options.prompt_lookup_min,
                             requests.budget)

    def _add_copies(self, runner, requests, result: DraftResult, copied, copying,
                    budget) -> set[int]:
        """Put the lookup drafts into the step's result (input-batch rows). A
        copied token is a draft from a one-hot q (draft_engine.write_one_hot)."""
        rows = set()
        for i in np.flatnonzero(copying):
            tokens = copied[i][: budget[i]].tolist()
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

    def _draft_or_nothing(self, runner, requests: DraftRequests) -> DraftResult:
        """A draft pass that raises, or hands back non-finite draft probabilities,
        costs this step its drafts, not the engine: the step decodes as plain
        decoding does, and the next step drafts again. Safe because verification
        decides every output token: K/V a failed pass wrote sits past each
        request's verified length, where nothing reads it before the target
        overwrites it. Under tensor parallelism this holds only for failures on
        every rank (docs/tensor-parallelism.md)."""
        num_rows = len(runner.input_batch.req_ids)
        if not requests.budget.any():
            # The cost model chose plain decoding for this step (or no request has
            # room left): no draft pass, and none of its per-step set-up.
            return _no_drafts(num_rows)
        try:
            maybe_fail("draft")
            result = self.draft(runner, requests)
            # A NaN or inf anywhere in a draft's logits reaches its token's top-1
            # probability (already on the CPU: no full-vocabulary scan here).
            if not all(math.isfinite(p) for row in result.top1_probs for p in row):
                raise FloatingPointError("draft probabilities are not finite (NaN or inf)")
            return result
        except Exception as e:  # noqa: BLE001 - contained: the step runs without drafts
            self.stats.draft_failures += 1
            self.stats.last_draft_error = f"{type(e).__name__}: {e}"
            if self.stats.draft_failures == 1:
                logger.exception(
                    "vllm-layerskip %s: the draft pass failed (step %d, %d requests, K=%d); "
                    "this step decodes without drafts and the next one drafts again. "
                    "Further failures are counted in status()['draft_failures'], not logged.",
                    self.method, self.stats.num_proposals, len(requests.rows),
                    self.num_speculative_tokens,
                )
            return _no_drafts(num_rows)

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
                if self.policy is not None:
                    self.policy.observe_acceptance(drafted, accepted)
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

    def _maybe_log(self) -> None:
        if time.monotonic() - self._last_log < LOG_INTERVAL_S:
            return
        self._last_log = time.monotonic()
        logger.info("vllm-layerskip %s: %s", self.method, self.status())

    @property
    def self_drafted_last_step(self) -> bool:
        """Whether the last step ran a draft pass (lookup drafts do not)."""
        return any(drafted for _, drafted in self._last_drafted.values())

    def tracked_request_ids(self) -> set[str]:
        """Ids of the requests this proposer holds state for. vLLM drops finished
        and aborted requests from the input batch, and so must the proposer: a
        subclass that keeps per-request state adds its ids here, and the status
        shows any id kept beyond the batch."""
        return set(self._last_drafted)

    def _maybe_write_status(self) -> None:
        if self._status_file is None or not self.agreement.is_leader:
            return
        status = {"method": self.method, "written_at": time.time(), **self.status()}
        try:
            write_json_atomic(self._status_file, status, durable=False, default=str)
        except OSError as e:  # a debugging aid must not stop serving
            logger.error("vllm-layerskip: cannot write %s=%s (%s); no longer writing it",
                         STATUS_FILE_ENV, self._status_file, e)
            self._status_file = None

    def status(self) -> dict:
        status = self.stats.as_dict()
        head = self.engine.head
        status["draft_vocab_size"] = head.token_ids.numel() if head is not None and head.pruned else 0
        status["draft_weights"] = self._draft_weights_status()
        status["requests"] = self.bookkeeping.as_dict()
        status["drafting_paused"] = self.drafting_paused
        status["prompt_lookup_paused"] = self.prompt_lookup_paused
        if self.policy is not None:
            status["cost_model"] = self.policy.summary()
        return status


def _copy_plan(copied: list[np.ndarray], room: np.ndarray,
               lookup_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Per drafting request at this lookup length: the most copied tokens it
    drafts, and whether its copied draft runs out (shorter than that budget
    while the request has room for more: its match reached the end of the
    context)."""
    budget = np.minimum(room, lookup_length)
    runs_out = np.array([0 < len(c) < min(b, r) for c, b, r in zip(copied, budget, room)],
                        dtype=bool)
    return budget, runs_out


def _no_drafts(num_rows: int) -> DraftResult:
    return DraftResult([[] for _ in range(num_rows)], None, 0, [[] for _ in range(num_rows)])


class RequestBookkeeping:
    """How much per-request state the proposer holds, after each step: it must
    never exceed the batch (no state left behind by finished or aborted requests)."""

    def __init__(self):
        self.in_batch = 0  # requests in the input batch at the last step
        self.tracked = 0  # requests the proposer holds state for
        self.tracked_outside_batch = 0  # of those, requests no longer in the batch
        self.max_tracked = 0

    def observe(self, batch_req_ids, tracked: set[str]) -> None:
        self.in_batch = len(batch_req_ids)
        self.tracked = len(tracked)
        self.tracked_outside_batch = len(tracked.difference(batch_req_ids))
        self.max_tracked = max(self.max_tracked, self.tracked)

    def as_dict(self) -> dict:
        return dict(vars(self))


class ProposerStats:
    """Counters a benchmark or test reads from the proposer (worker process)."""

    def __init__(self):
        self.num_proposals = 0
        self.num_forward_steps = 0
        self.num_draft_tokens = 0  # self-drafted and copied (prompt lookup)
        self.num_lookup_draft_tokens = 0  # copied from the context (prompt lookup)
        # Verified draft tokens and how many were accepted, per source. A
        # continuation's tokens count only where its whole copy was accepted.
        self.verified = {"self": [0, 0], "lookup": [0, 0], "continuation": [0, 0]}
        self.num_rows_run = 0  # rows the draft forwards ran (>= tokens: early exit)
        self.draft_seconds = 0.0
        # All of propose_from_runner, draft passes included: less draft_seconds,
        # the proposer's own per-step work (bookkeeping, lookup, the cost model).
        self.propose_seconds = 0.0
        self.draft_failures = 0  # draft passes that raised (the step ran without drafts)
        self.last_draft_error: str | None = None

    def record(self, result: DraftResult, seconds: float, num_copied: int = 0) -> None:
        self.num_proposals += 1
        self.num_forward_steps += result.num_forward_steps
        self.num_draft_tokens += result.num_draft_tokens
        self.num_lookup_draft_tokens += num_copied
        self.num_rows_run += result.num_rows_run
        self.draft_seconds += seconds

    def record_verified(self, drafted: int, accepted: int, source: str) -> None:
        counts = self.verified[source]
        counts[0] += drafted
        counts[1] += accepted

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["verified"] = {
            source: {"draft_tokens": n, "accepted": a, "acceptance": a / n if n else None}
            for source, (n, a) in self.verified.items()
        }
        return d

