"""The lookup replay's policies (benchmarks/analysis/lookup_match_length.py): the draft
length each cost picks, and greedy decoding again with lookup drafts, on
outputs built by hand (no engine, no tokenizer)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path[:0] = [BENCHMARKS, os.path.join(BENCHMARKS, "analysis")]  # benchlib; the analysis tools

from lookup_match_length import (accepted_length, best_length, decode_again,  # noqa: E402
                                 main, occurrences_agree, replay)


def test_the_length_follows_the_cost_of_a_verified_token():
    rates = np.array([0.9, 0.9, 0.9, 0.9])
    assert best_length(rates, 0.0) == 4  # free verification: draft all
    assert best_length(rates, 2.0) == 0  # a token dearer than a step's share: none
    # tokens per unit of time: 1.27 at 1, 1.355 at 2, 1.376 at 3, 1.365 at 4
    assert best_length(rates, 0.5) == 3
    assert best_length(np.array([0.1, 0.1]), 0.3) == 0  # rarely accepted: no draft


def test_an_output_that_repeats_its_prompt_decodes_in_fewer_steps():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    output = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # a verbatim copy of the prompt
    outputs = [(prompt, output)]
    steps, drafted, plain = decode_again(outputs, 2, 1, 4, lambda c: 4)
    assert plain == 8
    # Every step copies 4 tokens, all accepted: 5 tokens a step, 2 steps for 8.
    assert (steps, drafted) == (2, 7)  # the second draft meets the output's end after 3
    steps, drafted, _ = decode_again(outputs, 2, 1, 4, lambda c: 0)
    assert (steps, drafted) == (8, 0)  # no drafts: plain decoding's steps


def test_the_oracle_verifies_only_accepted_tokens_and_the_replay_counts_by_n():
    prompt = [5, 6, 7, 1, 2, 3]
    output = [5, 6, 9, 9, 5, 6, 7]
    outputs = [(prompt, output)]
    oracle = decode_again(outputs, 2, 1, 4, lambda c: accepted_length(c.draft, c.truth))
    blind = decode_again(outputs, 2, 1, 4, lambda c: 4)
    assert oracle[0] == blind[0]  # the same steps ...
    assert oracle[1] < blind[1]  # ... for fewer verified tokens
    by_n = replay(outputs, 2, 1, 4)
    assert set(by_n) <= {1, 2} and sum(row[0] for row in by_n.values()) > 0


def test_a_copy_knows_whether_earlier_occurrences_went_on_alike():
    assert occurrences_agree(np.array([7, 1, 7, 1, 7]), 1)  # 7 -> 1 both times
    assert not occurrences_agree(np.array([7, 1, 7, 2, 7]), 1)  # 7 -> 1, then 7 -> 2
    seen: dict = {}
    decode_again([([7, 1, 7, 2], [7, 1, 7])], 1, 1, 2, lambda c: 2, seen)
    # The first copy follows 7, which went on as 1 and as 2; the second follows
    # 1, which went on one way only. The first copy missed: the second's last is "zero".
    assert set(seen) == {(1, False, "none"), (1, True, "zero")}


def test_a_negative_token_cost_is_refused_before_anything_loads():
    with pytest.raises(SystemExit, match=r"--token-cost \[0.25, -1.0\]: a cost is >= 0"):
        main(["no-such-run.json", "--model", "no-such-model", "--token-cost", "0.25", "-1"])
