"""Prompt lookup (core/lookup.py): which continuation a request's context offers."""

import numpy as np
import pytest

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


def reference_continuation(tokens, max_n, min_n, k):
    """The definition, by brute force: for n from the longest, the most recent
    earlier end e (e <= L - 2) whose n tokens equal the last n."""
    tokens = list(tokens)
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        for e in range(length - 2, n - 2, -1):
            if tokens[e - n + 1: e + 1] == tokens[length - n:]:
                return tokens[e + 1: e + 1 + k]
    return []


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matches_the_definition_on_random_contexts(dtype):
    # A small alphabet makes matches, and byte patterns across token borders
    # (the search runs over the tokens' bytes), common.
    rng = np.random.default_rng(0)
    for _ in range(3000):
        size = int(rng.integers(1, 40))
        if rng.random() < 0.5:
            tokens = rng.integers(0, int(rng.choice([2, 3, 5, 300])), size=size)
        else:  # one byte set, at different places: matches across token borders
            tokens = rng.choice([0, 1, 1 << 8, 1 << 16, 1 << 24], size=size)
        tokens = tokens.astype(dtype)
        max_n = int(rng.integers(1, 5))
        min_n = int(rng.integers(1, max_n + 1))
        k = int(rng.integers(1, 6))
        got = find_continuation(tokens, max_n, min_n, k)
        assert got.tolist() == reference_continuation(tokens.tolist(), max_n, min_n, k), (
            tokens.tolist(), max_n, min_n, k)
        assert got.dtype == tokens.dtype


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


def test_which_copies_run_out_before_the_room():
    from vllm_layerskip.core.step_plan import copy_plan

    # Room 4, lookup length 3: a 2-token copy runs out (a self-draft may go on
    # after it); no copy, or a copy cut to a room of 2, does not.
    copied = [t(1, 2), t(), t(1, 2, 3, 4), t(5, 6, 7)]
    budget, runs_out = copy_plan(copied, np.array([4, 4, 2, 4]), 3)
    assert budget.tolist() == [3, 3, 2, 3]
    assert runs_out.tolist() == [True, False, False, False]
    # Lookup off this step: nothing is copied, so nothing runs out.
    assert not copy_plan(copied, np.array([4, 4, 2, 4]), 0)[1].any()


def test_a_copied_draft_is_one_hot_over_whatever_the_row_held():
    import torch

    from vllm_layerskip.core.draft_batch import write_one_hot

    probs = torch.full((2, 3, 10), 0.1)
    write_one_hot(probs, 1, [4, 7])
    assert probs[1, 0].tolist() == [0.0] * 4 + [1.0] + [0.0] * 5
    assert probs[1, 1].argmax() == 7 and probs[1, 1].sum() == 1.0
    assert probs[1, 2].sum() == 0.0  # after the copy: for a continuing self-draft
    assert torch.all(probs[0] == 0.1)  # other rows untouched


def test_an_early_exit_draft_refuses_to_continue_a_copy():
    # AdaDecode's exit heads write no K/V above their exit layer, which the
    # tokens after a copy would read: the engine refuses rather than draft wrong.
    from types import SimpleNamespace

    import pytest
    import torch

    from vllm_layerskip.core.draft_batch import DraftRequests

    from vllm_layerskip.core.draft_engine import DraftEngine
    from vllm_layerskip.methods.adadecode.early_exit import EarlyExit, EarlyExitPath

    engine = DraftEngine(vllm_config=None, num_speculative_tokens=3)
    engine.stack = SimpleNamespace(num_layers=4)
    runner = SimpleNamespace(input_batch=SimpleNamespace(num_reqs=1))
    requests = DraftRequests(rows=t(0), last_token=t(5), last_position=t(3), budget=t(3),
                             temperature=np.zeros(1, dtype=np.float32), prefix=[t(7)])
    path = EarlyExitPath(EarlyExit(layers=(2,), transforms=torch.zeros(1, 2, 2), threshold=0.5), 4)
    with pytest.raises(ValueError, match="EarlyExitPath drafts cannot continue a copied draft"):
        engine.draft(runner, requests, path=path)


def test_the_most_recent_longest_match_wins_on_random_contexts():
    """find_continuation against a direct reading of its contract, on small
    vocabularies (many matches of every length)."""
    rng = np.random.default_rng(1)
    for _ in range(3000):
        tokens = rng.integers(0, int(rng.integers(1, 5)), size=int(rng.integers(1, 40)))
        max_n = int(rng.integers(1, 5))
        min_n = int(rng.integers(1, max_n + 1))
        k = int(rng.integers(1, 5))
        expected = np.zeros(0, dtype=tokens.dtype)
        length = len(tokens)
        for n in range(min(max_n, length - 1), min_n - 1, -1):
            ends = [e for e in range(n - 1, length - 1)
                    if np.array_equal(tokens[e - n + 1: e + 1], tokens[length - n:])]
            if ends:
                expected = tokens[ends[-1] + 1: ends[-1] + 1 + k]
                break
        assert np.array_equal(find_continuation(tokens, max_n, min_n, k), expected)
