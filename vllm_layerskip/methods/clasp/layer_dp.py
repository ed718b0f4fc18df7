"""CLaSp's layer-selection DP (Chen et al., ACL 2025, Algorithm 1 / Eq. 2) as a
pure function of a layer function and the token's embedding.

g(i, j) is the residual-stream state after the first i decoder layers with j of
them skipped that is closest (cosine) to the full model's x_i:

    g(i, 0) = x_i   (nothing skipped: the full model)
    g(i, j) = the better of  f_{i-1}(g(i-1, j))   (run layer i-1)
                             g(i-1, j-1)          (skip layer i-1)

All j of one layer step are independent given row i-1, so layer i-1 runs once
on the whole row g(i-1, 0..n) (the paper's Sec. 3.6). Column 0 is the full
model itself, so the targets x_i come out of the same L batched layer calls
instead of a separate full forward. The skip set is read back from the
(L, M) corner. The DP is approximate (each cell keeps one state; the paper's
Sec. 3.5 argues it comes close to exhaustive search).

Several requests can share one skip set: a cell's candidate is then a set of
states, one per request, and its score is the mean cosine over the requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from vllm_layerskip.kernels.clasp_dp import dp_select

# layer_fn(i, states [R, n, H]) -> [R, n, H]: decoder layer i on n states of
# each of R requests (residual stream in and out).
LayerFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DPResult:
    skipped: tuple[int, ...]  # the skipped layers, ascending
    score: float  # mean over requests of cos(g(L, M), x_L)


def clasp_dp(
    layer_fn: LayerFn,
    x0: torch.Tensor,  # [R, H]: each request's token embedding (x_0)
    num_layers: int,  # L
    num_skip: int,  # M
    protected: frozenset[int] = frozenset(),  # layers that are never skipped
) -> DPResult:
    num_reqs, hidden = x0.shape
    m = num_skip
    # skippable[i]: unprotected layers among the first i; g(i, j) exists iff j <= it.
    skippable = np.concatenate([[0], np.cumsum([i not in protected for i in range(num_layers)])])
    j = torch.arange(1, m + 1, device=x0.device)
    # g(i, 0..M) of every request. Cells that do not exist yet hold zeros and
    # are flagged invalid, so they never win.
    g = x0.new_zeros(num_reqs, m + 1, hidden)
    g[:, 0] = x0
    # [layer i-1, j-1], on the states' device and read back once at the end, so
    # on a GPU the host queues layer after layer without waiting for the device.
    # (H100, Llama-3-8B shapes: a DP is still bound by its ~23 kernel launches
    # per layer, ~17 ms of host time for 3 ms of GPU time; docs/limits.md.)
    took_skip = torch.zeros((num_layers, m), dtype=torch.bool, device=x0.device)
    best = torch.full((m,), float("-inf"), device=x0.device)
    for i in range(1, num_layers + 1):
        reachable = int(skippable[i - 1])
        n = min(m, reachable)  # run layer i-1 on the cells g(i-1, 0..n) that exist
        computed = torch.cat([layer_fn(i - 1, g[:, : n + 1]), g[:, n + 1 :]], dim=1)
        x_i = computed[:, 0]
        computed, skipped = computed[:, 1:], g[:, :-1]  # for j = 1..M
        computed_valid = j <= reachable
        skipped_valid = (j - 1 <= reachable) & ((i - 1) not in protected)
        take, best = _select(computed, skipped, x_i, computed_valid, skipped_valid)
        g = torch.cat([x_i[:, None], torch.where(take[None, :, None], skipped, computed)], dim=1)
        took_skip[i - 1] = take
    score = float(best[m - 1])
    if not np.isfinite(score):
        raise ValueError(
            f"no way to skip {m} of {num_layers} layers with {len(protected)} protected"
        )
    return DPResult(_backtrack(took_skip.cpu().numpy(), m), score)


def _select(computed, skipped, target, computed_valid, skipped_valid):
    """Per j, whether skipping beats computing on the mean cosine over requests.

    kernels.clasp_dp.dp_select scores rows against one target. Concatenating
    each request's unit vectors makes that one cosine the mean of the
    per-request cosines (|a| = |t| = sqrt(R), a.t = sum of cosines), so one
    call decides all j for all requests. The chosen raw states are taken by
    the caller; the kernel's copies of the unit vectors are not used.
    """
    num_reqs, m, hidden = computed.shape

    def rows(x):  # [R, M, H] -> [M, R * H] of unit vectors
        return F.normalize(x.float(), dim=-1).transpose(0, 1).reshape(m, num_reqs * hidden)

    unit_target = F.normalize(target.float(), dim=-1).reshape(num_reqs * hidden)
    _, take, best = dp_select(
        rows(computed), rows(skipped), unit_target, computed_valid, skipped_valid
    )
    return take, best


def _backtrack(took_skip: np.ndarray, m: int) -> tuple[int, ...]:
    """Walk back from g(L, M): each cell that took "skip" skipped its layer."""
    skipped = []
    j = m
    for layer in range(took_skip.shape[0] - 1, -1, -1):
        if j == 0:
            break
        if took_skip[layer, j - 1]:
            skipped.append(layer)
            j -= 1
    assert j == 0, "backtracking ended before M layers were skipped"
    return tuple(sorted(skipped))
