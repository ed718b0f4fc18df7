"""One step's plan of drafts, per drafting request: tokens copied from its
context, tokens self-drafted (after its copy where a copy that ran out is
continued), or none. Built once from the cost model's decision and read, never
changed, by the draft pass and the step's bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepPlan:
    # [num_drafting] tokens each request drafts through the model: its
    # self-draft, or its continued copy plus the self-draft after it.
    self_budget: np.ndarray
    # [num_drafting] whether the request's draft is its copy alone (no model pass).
    copying: np.ndarray
    # [num_drafting] copied tokens each request's draft takes (copying or continuing).
    copy_budget: np.ndarray
    # [num_drafting] copied tokens opening a continued self-draft (empty where
    # none); None: no request continues a copy this step.
    prefix: list[np.ndarray] | None


def has_copy(copied: list[np.ndarray]) -> np.ndarray:
    """[num_drafting] whether each request's lookup found a copy."""
    return np.array([len(c) > 0 for c in copied], dtype=bool)


def copy_plan(copied: list[np.ndarray], room: np.ndarray,
              lookup_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Per drafting request at this copy length: the most copied tokens it
    drafts, and whether its copied draft runs out (shorter than that budget
    while the request has room for more: its match reached the end of the
    context)."""
    budget = np.minimum(room, lookup_length)
    runs_out = np.array([0 < len(c) < min(b, r) for c, b, r in zip(copied, budget, room)],
                        dtype=bool)
    return budget, runs_out


def probe_rows(offset: int, eligible: np.ndarray, num_rows: int) -> tuple[np.ndarray, int]:
    """([num_drafting] which requests a probe drafts for, the next offset): `num_rows`
    of the `eligible` ones (bool), starting at `offset` and rotating over them
    from probe to probe, so the acceptance estimate is not one request's."""
    candidates = np.flatnonzero(eligible)
    total = len(candidates)
    keep = np.zeros(len(eligible), dtype=bool)
    if total == 0 or num_rows <= 0:
        return keep, offset
    keep[candidates[(offset + np.arange(num_rows)) % total]] = True
    return keep, (offset + num_rows) % total


def plan_step(copied: list[np.ndarray], room: np.ndarray, lookup_length: int,
              self_length: int, self_rows: np.ndarray | None,
              continue_length: int) -> StepPlan:
    """The step's plan. `copied`: each request's copy (may be empty), `room`:
    the draft tokens it has room for; `lookup_length`: tokens a copy drafts (0:
    no copies this step, the requests with one self-draft as the others);
    `self_length`: tokens a self-draft drafts; `self_rows`: which requests
    self-draft (None: all without a copy taken); `continue_length`: self-draft
    tokens after a copy that runs out (0: none)."""
    found = has_copy(copied)
    copying = found if lookup_length else np.zeros_like(found)
    self_budget = np.minimum(room, self_length)
    if self_rows is not None:
        self_budget = np.where(self_rows, self_budget, 0)
    self_budget = np.where(copying, 0, self_budget)
    budget, runs_out = copy_plan(copied, room, lookup_length)
    continuing = copying & runs_out if continue_length else np.zeros_like(copying)
    prefix = None
    if continuing.any():
        prefix = [copied[i][: budget[i]] if continuing[i] else copied[i][:0]
                  for i in range(len(copied))]
        for i in np.flatnonzero(continuing):
            self_budget[i] = min(room[i], len(prefix[i]) + continue_length)
        copying = copying & ~continuing
    return StepPlan(self_budget=self_budget, copying=copying, copy_budget=budget, prefix=prefix)


def stopped_drafts(plan: StepPlan, rows: np.ndarray,
                   token_ids: list[list[int]]) -> tuple[list[int], list[int]]:
    """Requests (indices into the step's drafting requests) whose self-draft
    stopped before its budget: a confidence gate cut the chain, or an
    early-exit draft found no confident head. (those that self-drafted no
    token, those that self-drafted some.) For the cost model the stopping
    position is a rejection: asked for k tokens, the chain yielded fewer, and a
    position that yields nothing is one that gains nothing."""
    empty, short = [], []
    for i in np.flatnonzero(plan.self_budget):
        prefix = len(plan.prefix[i]) if plan.prefix is not None else 0
        drafted = max(len(token_ids[int(rows[i])]) - prefix, 0)
        if drafted < plan.self_budget[i] - prefix:
            (short if drafted else empty).append(int(i))
    return empty, short
