"""Prompt lookup (core/lookup.py): which continuation a request's context offers."""

import numpy as np

from vllm_layerskip.core.lookup import find_continuation, lookup_drafts


def t(*ids):
    return np.array(ids, dtype=np.int64)


def test_longest_suffix_first_then_most_recent_occurrence():
    # ... 1 2 3 -> 7 8 (3-gram), and 2 3 -> 9 (2-gram, more recent): the 3-gram wins.
    tokens = t(1, 2, 3, 7, 8, 0, 2, 3, 9, 5, 1, 2, 3)
    assert find_continuation(tokens, max_n=3, min_n=2, k=2).tolist() == [7, 8]
    assert find_continuation(tokens, max_n=2, min_n=2, k=3).tolist() == [9, 5, 1]
    # Two occurrences of the 3-gram: the most recent one's continuation.
    tokens = t(1, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 3)
    assert find_continuation(tokens, max_n=3, min_n=3, k=2).tolist() == [5, 6]


def test_no_match_short_context_and_the_continuation_running_out():
    assert find_continuation(t(1, 2, 3, 4), max_n=3, min_n=1, k=4).tolist() == []
    assert find_continuation(t(5), max_n=3, min_n=1, k=4).tolist() == []
    # The only earlier "4" is right before the end: one token of continuation.
    assert find_continuation(t(4, 6, 4), max_n=2, min_n=1, k=4).tolist() == [6, 4]
    # A periodic pattern continues through itself.
    assert find_continuation(t(1, 2, 1, 2, 1, 2), max_n=2, min_n=2, k=5).tolist() == [1, 2]


def test_per_request_rows_lengths_and_budgets():
    token_ids = np.zeros((3, 10), dtype=np.int64)
    token_ids[0, :6] = [1, 2, 3, 1, 2, 3]
    token_ids[2, :7] = [4, 5, 6, 7, 4, 5, 6]
    drafts = lookup_drafts(token_ids, np.array([6, 3, 7]), rows=np.array([2, 0, 1]),
                           max_n=3, min_n=2, budget=np.array([1, 4, 2]))
    # Row 1 holds three zeros: its last two occurred at its start.
    assert [d.tolist() for d in drafts] == [[7], [1, 2, 3], [0]]
    # Nothing past a request's own tokens is read: row 1's padding zeros never continue it.
    assert lookup_drafts(token_ids, np.array([6, 3, 7]), np.array([1]), 2, 1,
                         np.array([4]))[0].tolist() == [0]
    assert lookup_drafts(token_ids, np.array([6, 3, 7]), np.array([0]), 3, 2,
                         np.array([0]))[0].tolist() == []  # no budget, no search
