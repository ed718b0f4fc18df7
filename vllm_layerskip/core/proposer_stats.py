"""What a proposer counts for its status and for benchmarks: drafts and
acceptance per source, time spent, and the per-request state it holds; and
where the status goes (the log every LOG_INTERVAL_S, the status file)."""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from vllm_layerskip.core.draft_batch import DraftResult
from vllm_layerskip.core.versioned_file import write_json_atomic

logger = logging.getLogger("vllm.layerskip")

LOG_INTERVAL_S = 30.0
# Debugging and load tests (benchmarks/load_test.py): the proposer's status() as JSON
# in this file, rewritten after every step (by tensor-parallel rank 0 only).
STATUS_FILE_ENV = "VLLM_LAYERSKIP_STATUS_FILE"


class StatusReports:
    """The proposer's status in the log every LOG_INTERVAL_S seconds, and in
    the file STATUS_FILE_ENV names (if set) after every step."""

    def __init__(self):
        self._last_log = time.monotonic()
        self.status_file = os.environ.get(STATUS_FILE_ENV) or None

    def after_step(self, method: str, status: Callable[[], dict], is_leader: bool) -> None:
        if time.monotonic() - self._last_log >= LOG_INTERVAL_S:
            self._last_log = time.monotonic()
            logger.info("vllm-layerskip %s: %s", method, status())
        if self.status_file is None or not is_leader:
            return
        report = {"method": method, "written_at": time.time(), **status()}
        try:
            write_json_atomic(self.status_file, report, durable=False, default=str)
        except OSError as e:  # a debugging aid must not stop serving
            logger.error("vllm-layerskip: cannot write %s=%s (%s); no longer writing it",
                         STATUS_FILE_ENV, self.status_file, e)
            self.status_file = None


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
        # Proposals that drafted nothing, neither self-drafted nor copied (the
        # cost model's "no draft", or no request with room), and their seconds:
        # what the proposer costs a step where it does not pay.
        self.num_idle_proposals = 0
        self.idle_seconds = 0.0
        # Of idle_seconds, the method's own per-step work (its before_draft:
        # SWIFT's optimizer and scoring passes, CLaSp's DP), the rest being the
        # shared proposer's (lookup, the cost model, bookkeeping).
        self.idle_method_seconds = 0.0
        # Proposals whose draft pass ran and drafted nothing (every chain
        # stopped before its first token), and their seconds: a draft that did
        # not pay, not the proposer's overhead.
        self.num_empty_passes = 0
        self.empty_pass_seconds = 0.0
        # Requests whose self-draft yielded no token (the cost model counts each
        # as a rejection at the first position).
        self.num_empty_drafts = 0
        self.draft_failures = 0  # draft passes that raised (the step ran without drafts)
        self.last_draft_error: str | None = None

    def record(self, result: DraftResult, seconds: float, num_copied: int = 0) -> None:
        self.num_proposals += 1
        self.num_forward_steps += result.num_forward_steps
        self.num_draft_tokens += result.num_draft_tokens
        self.num_lookup_draft_tokens += num_copied
        self.num_rows_run += result.num_rows_run
        self.draft_seconds += seconds

    def record_nothing_drafted(self, seconds: float, ran_a_pass: bool = False,
                               method_seconds: float = 0.0) -> None:
        """A proposal that drafted nothing: idle, or an empty pass if a draft
        pass ran. `method_seconds`: the part of `seconds` the method's own
        per-step work took."""
        if ran_a_pass:
            self.num_empty_passes += 1
            self.empty_pass_seconds += seconds
        else:
            self.num_idle_proposals += 1
            self.idle_seconds += seconds
            self.idle_method_seconds += method_seconds

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

