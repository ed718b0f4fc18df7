"""The objectives of Self-SD's offline search (offline_search.py): the value of
each evaluation, "speed", "proxy" or "acceptance" (the module docstring there
says what each measures)."""

from __future__ import annotations

import numpy as np


def rescore(objective: str, history: list[dict]) -> None:
    """Objective values of every evaluation so far.

    speed: the measured tokens/s. proxy: Eq. 6 with each set's own M and alpha,
    and a draft cost c proportional to the weights the set keeps, at the median
    cost per weight of all evaluations: the per-run measurement of c is the
    noisy part, and the median keeps one slow run from ranking a set first or
    last; the weights tell sets of one size apart (skipping an MLP saves far
    more than skipping an attention sub-layer). Checkpoints from before the
    weights were recorded use the median c itself."""
    if objective == "speed":
        for h in history:
            h["value"] = h["tokens_per_second"]
        return
    if objective == "acceptance":
        # alpha <= 1, so 1e-4 alpha only orders sets whose M is equal.
        for h in history:
            h["value"] = h["M"] + 1e-4 * h["alpha"]
        return
    with_weights = all(h.get("kept_weights") for h in history)
    per_weight = float(np.median([h["c"] / h["kept_weights"] for h in history])) if with_weights else None
    median_c = float(np.median([h["c"] for h in history]))
    for h in history:
        c = per_weight * h["kept_weights"] if with_weights else median_c
        m, alpha = h["M"], h["alpha"]
        h["value"] = m * alpha / ((m - 1) * c + alpha) if alpha > 0 else 0.0
        h["c_used"] = c
