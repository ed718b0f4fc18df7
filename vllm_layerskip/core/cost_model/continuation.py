"""A copy that runs out, continued by a self-draft: how many self-draft tokens
to add after the copied ones (core/cost_model/policy.py asks, once a step, for
the requests whose copy is shorter than their room).

Continuation tokens count only where the whole copy is accepted (the lookup
rates), and they share the step's draft passes: the first pass also feeds the m
copied tokens of each continued request, so that their K/V is written before
the continuation drafts from them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from vllm_layerskip.core.cost_model.estimators import argmax_length, expected_tokens
from vllm_layerskip.core.cost_model.verify_cost import VerifyCost


def best_continuation(line: VerifyCost, draft_seconds: Callable[[float], float],
                      rates: np.ndarray, lookup_rates: np.ndarray, num_reqs: int,
                      self_plan: tuple[int, int], copy_lengths: np.ndarray,
                      run_out_lengths: np.ndarray, margin: float, max_k: int) -> int:
    """The continuation length j (0: none) with the most tokens per second for
    the step: `self_plan` = (length, requests) of its self-drafts, `copy_lengths`
    its other copies, `run_out_lengths` the m copied tokens of each copy that
    runs out; `draft_seconds(rows)` a draft forward's cost, `line` the verify
    cost; `rates`/`lookup_rates` the per-position acceptance of self-drafts and
    of copies."""
    n = len(run_out_lengths)
    self_length, self_rows = self_plan
    copies = np.concatenate([copy_lengths, run_out_lengths]).astype(np.int64)
    tokens = (num_reqs + sum(expected_tokens(lookup_rates, int(m)) - 1 for m in copies)
              + self_rows * (expected_tokens(rates, self_length) - 1))
    verified = num_reqs + int(copies.sum()) + self_rows * self_length
    # Requests whose whole copy is accepted, in expectation: those a continuation reaches.
    reach = sum(float(np.prod(lookup_rates[:m])) for m in run_out_lengths)
    first_pass = int((run_out_lengths + 1).sum())

    def seconds(j: int) -> float:
        total = 0.0
        for step in range(max(self_length, j)):
            size = (self_rows if step < self_length else 0) + (
                (first_pass if step == 0 else n) if step < j else 0)
            total += draft_seconds(size) if size else 0.0
        return total + line.predict(verified + n * j, drafting=j > 0 or verified > num_reqs)

    best_j, _ = argmax_length(rates, seconds, tokens, reach, margin,
                              max_length=max_k - int(run_out_lengths.min()))
    return best_j
