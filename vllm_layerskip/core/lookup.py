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
    # An earlier occurrence lies wholly in tokens[:L-1] (a continuation exists);
    # bytes.rfind finds the most recent one in C. Several numpy comparisons over
    # the context per n cost 64 us a step here at batch 1 (SmolLM2, 2 cores),
    # ~4x this search; a match at an offset that is not a whole token is skipped.
    size = tokens.itemsize
    context = tokens[: length - 1].tobytes()
    for n in range(top, min_n - 1, -1):
        needle = tokens[length - n:].tobytes()
        end = len(context)
        while (at := context.rfind(needle, 0, end)) >= 0 and at % size:
            end = at + len(needle) - 1
        if at >= 0:
            e = at // size + n - 1  # the occurrence's last token
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


class PromptLookup:
    """Prompt lookup as the proposer's copy source ("copy_source":
    "prompt_lookup"; core/suffix_copies.py is the other). It keeps no state."""

    request_ids: frozenset = frozenset()

    def __init__(self, max_n: int, min_n: int):
        self.max_n, self.min_n = max_n, min_n

    def drafts(self, batch, rows: np.ndarray, budget: np.ndarray) -> list[np.ndarray]:
        """Each row's copy (vLLM's input batch `batch`, rows `rows`), at most `budget[i]` tokens."""
        return lookup_drafts(batch.token_ids_cpu, batch.num_tokens_no_spec, rows,
                             self.max_n, self.min_n, budget)
