"""Which recent tokens SWIFT's scoring pass scores a set on: the windows of
generated text picked from the running requests, and their arrays."""

from __future__ import annotations

import numpy as np

from vllm_layerskip.core.draft_batch import DraftRequests
from vllm_layerskip.methods.swift.scoring import ScoreWindows

Window = tuple[int, int, int]  # (input-batch row, start position, length)


class WindowPicker:
    def __init__(self, options):
        self.options = options  # SwiftOptions: context_window, max_score_tokens
        self.rotation = 0  # which request comes first next time

    def pick(self, runner, requests: DraftRequests,
             fresh_from: dict[str, int] | None = None) -> list[Window]:
        """(row, start, length) of the most recent generated tokens of the
        running requests, up to gamma (`context_window`) per request and
        max_score_tokens in all; requests take turns being first so every stream
        is scored over time. With `fresh_from` (request id -> position), a
        request's window starts no earlier than its position there."""
        n = len(requests.rows)
        if n == 0:
            return []
        batch = runner.input_batch
        order = (np.arange(n) + self.rotation) % n  # np.roll by -rotation, a tenth of its cost
        self.rotation += 1
        budget = self.options.max_score_tokens
        picked = []
        for i in order:
            row, p = int(requests.rows[i]), int(requests.last_position[i])
            # Targets must be generated tokens (positions >= num_prompt_tokens).
            first = max(p - self.options.context_window, int(batch.num_prompt_tokens[row]) - 1, 0)
            if fresh_from is not None:
                first = max(first, fresh_from.get(batch.req_ids[row], 0))
            length = min(p - first, budget)
            if length < 1:
                continue
            picked.append((row, p - length, length))
            budget -= length
            if budget == 0:
                break
        return picked


def build_windows(runner, picked: list[Window]) -> ScoreWindows:
    """The picked windows' tokens and targets, read from the input batch."""
    # Short queries first: some attention backends want decode-like
    # requests before longer ones.
    picked = sorted(picked, key=lambda w: w[2])
    tokens = runner.input_batch.token_ids_cpu
    return ScoreWindows(
        rows=np.array([w[0] for w in picked], dtype=np.int64),
        starts=np.array([w[1] for w in picked], dtype=np.int64),
        lengths=np.array([w[2] for w in picked], dtype=np.int64),
        input_ids=np.concatenate([tokens[r, s : s + n] for r, s, n in picked]).astype(np.int64),
        targets=np.concatenate([tokens[r, s + 1 : s + n + 1] for r, s, n in picked]).astype(np.int64),
    )
