"""The failure boundary around a draft pass: a pass that fails costs only its
step's drafts, never the engine or another request."""

from __future__ import annotations

import logging
import math
from typing import Callable

from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult
from vllm_layerskip.core.faults import maybe_fail

logger = logging.getLogger("vllm.layerskip")


def draft_or_nothing(draft: Callable[..., DraftResult], runner, requests: DraftRequests,
                     stats, method: str, k: int) -> DraftResult:
    """`draft(runner, requests)`, or no drafts where it raises or hands back
    non-finite draft probabilities: the step decodes as plain decoding does, and
    the next step drafts again. Safe because verification decides every output
    token: K/V a failed pass wrote sits past each request's verified length,
    where nothing reads it before the target overwrites it. Under tensor
    parallelism this holds only for failures on every rank
    (docs/tensor-parallelism.md). `stats` (core/proposer_stats.ProposerStats)
    counts the failures; the first is logged."""
    num_rows = len(runner.input_batch.req_ids)
    if not requests.budget.any():
        # No request drafts through the model this step (or none has room left):
        # no draft pass, and none of its per-step set-up.
        return DraftResult.none(num_rows)
    try:
        maybe_fail("draft")
        result = draft(runner, requests)
        # A NaN or inf anywhere in a draft's logits reaches its token's top-1
        # probability (already on the CPU: no full-vocabulary scan here).
        if not all(math.isfinite(p) for row in result.top1_probs for p in row):
            raise FloatingPointError("draft probabilities are not finite (NaN or inf)")
        return result
    except Exception as e:  # noqa: BLE001 - contained: the step runs without drafts
        stats.draft_failures += 1
        stats.last_draft_error = f"{type(e).__name__}: {e}"
        if stats.draft_failures == 1:
            logger.exception(
                "vllm-layerskip %s: the draft pass failed (step %d, %d requests, K=%d); "
                "this step decodes without drafts and the next one drafts again. "
                "Further failures are counted in status()['draft_failures'], not logged.",
                method, stats.num_proposals, len(requests.rows), k,
            )
        return DraftResult.none(num_rows)
