"""Prompt lookup: a draft copied from the request's own context.

Where the output repeats its context (a summary quoting its source, an answer
from a document, an edit of given code, a list that follows a pattern), the
tokens that followed the last occurrence of the request's most recent n tokens
are a draft that costs no model pass at all, only its verification. Every
layer-skip method takes vLLM's own keys `prompt_lookup_max` / `_min` and drafts
this way for the requests that have such a match (core/proposer.py); the others
draft with the method's skip set, and the cost model weighs both sources
(core/cost_model.py).

Matching: for n from max_n down to min_n, the request's last n tokens are
looked for in its earlier tokens (prompt and output); the most recent
occurrence wins, the longest n first. Its continuation, up to k tokens, is the
draft. Everything here reads token ids only, which every tensor-parallel rank
holds alike, so every rank finds the same drafts.
"""

from __future__ import annotations

import numpy as np

# Older context is not searched: the most recent occurrence is the one that
# wins anyway, and the search costs time per step (about 0.1 ms per request at
# this length here).
SEARCH_WINDOW = 16384


def find_continuation(tokens: np.ndarray, max_n: int, min_n: int, k: int) -> np.ndarray:
    """The up-to-k tokens that followed the most recent earlier occurrence of
    the longest suffix n-gram (n in max_n..min_n) of `tokens` ([L] ints); an
    empty array if there is none."""
    tokens = tokens[-SEARCH_WINDOW:]
    length = len(tokens)
    top = min(max_n, length - 1)
    if top < min_n:
        return tokens[:0]
    # By the end e of an earlier occurrence (e <= L - 2: a continuation exists):
    # matched[n - 1][e] says the n tokens ending at e are the last n. One
    # comparison over the context per n, where a loop over the first token's
    # occurrences cost ~0.1 ms a request a step at batch 1 (a common token
    # occurs hundreds of times).
    matched = [tokens[: length - 1] == tokens[length - 1]]
    for u in range(1, top):
        m = matched[-1].copy()
        m[:u] = False
        m[u:] &= tokens[: length - 1 - u] == tokens[length - 1 - u]
        matched.append(m)
    for n in range(top, min_n - 1, -1):
        ends = np.flatnonzero(matched[n - 1])
        if len(ends):
            e = int(ends[-1])  # the most recent
            return tokens[e + 1: e + 1 + k]
    return tokens[:0]


def lookup_drafts(token_ids: np.ndarray, num_tokens: np.ndarray, rows: np.ndarray,
                  max_n: int, min_n: int, budget: np.ndarray) -> list[np.ndarray]:
    """For each request row (input-batch rows `rows` of `token_ids`, whose first
    `num_tokens[row]` are its prompt and output), its lookup draft of at most
    `budget[i]` tokens (possibly empty)."""
    return [
        find_continuation(token_ids[row, : num_tokens[row]], max_n, min_n, int(b)) if b > 0
        else token_ids[row, :0]
        for row, b in zip(rows, budget)
    ]
