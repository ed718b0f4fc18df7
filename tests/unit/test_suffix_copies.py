"""Suffix-tree copies (core/suffix_copies.py, "copy_source": "suffix_tree"): the
trees follow vLLM's input batch, and a copy may come from an earlier request's
output; the option's checks."""

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.suffix_copies import SuffixTreeCopies
from vllm_layerskip.methods.registry import method


class Batch:
    """The parts of vLLM's InputBatch the copies read: rows of token ids."""

    def __init__(self, width=64):
        self.width = width
        self.req_ids: list[str] = []
        self.rows: list[list[int]] = []
        self.prompts: list[int] = []

    def add(self, req_id, prompt):
        self.req_ids.append(req_id)
        self.rows.append(list(prompt))
        self.prompts.append(len(prompt))

    def remove(self, req_id):
        i = self.req_ids.index(req_id)
        for seq in (self.req_ids, self.rows, self.prompts):
            del seq[i]

    def view(self):
        ids = np.zeros((len(self.rows), self.width), dtype=np.int32)
        for i, row in enumerate(self.rows):
            ids[i, : len(row)] = row
        return SimpleNamespace(
            token_ids_cpu=ids, num_tokens_no_spec=np.array([len(r) for r in self.rows]),
            num_prompt_tokens=np.array(self.prompts), req_ids=list(self.req_ids),
            req_id_to_index={r: i for i, r in enumerate(self.req_ids)})


def drafts(copies, batch, budget=8):
    view = batch.view()
    rows = np.arange(len(batch.rows))
    return [d.tolist() for d in copies.drafts(view, rows, np.full(len(rows), budget))]


def test_a_copy_is_at_most_as_long_as_its_match_and_offered_where_it_expects_two_tokens():
    copies, batch = SuffixTreeCopies(), Batch()
    batch.add("a", list(range(1, 13)) + [1, 2, 3, 4, 5])
    # The last 5 tokens match the prompt's start once: 5 tokens follow, each
    # estimated at 1/2 (the occurrence at the end has no continuation yet).
    assert drafts(copies, batch) == [[6, 7, 8, 9, 10]]
    # Room for 3: an expected 1.5 tokens accepted, below 2: no copy.
    assert drafts(copies, batch, budget=3) == [[]]
    # The output goes on as the prompt did: the match grows, and so does the copy.
    batch.rows[0] += [6, 7]
    assert drafts(copies, batch) == [[8, 9, 10, 11, 12, 1, 2]]
    # No earlier occurrence of the last token: nothing to copy.
    batch.rows[0] += [42]
    assert drafts(copies, batch) == [[]]


def test_an_earlier_requests_output_is_copied_after_it_leaves_the_batch():
    copies, batch = SuffixTreeCopies(), Batch()
    batch.add("a", [10, 11])
    drafts(copies, batch)
    batch.rows[0] += [20, 21, 22, 23, 24, 25, 26, 27]  # a's output
    drafts(copies, batch)
    assert copies.request_ids == {"a"}
    batch.remove("a")
    batch.add("b", [30, 20, 21, 22, 23])  # starts the way a's output did
    assert drafts(copies, batch) == [[24, 25, 26, 27]]
    assert copies.request_ids == {"b"}  # a's tree is gone, its output kept


def test_rows_without_budget_still_feed_their_tree():
    copies, batch = SuffixTreeCopies(), Batch()
    batch.add("a", list(range(1, 13)))
    batch.add("b", [7, 8, 9])
    view = batch.view()
    out = copies.drafts(view, np.array([0, 1]), np.array([0, 4]))
    assert [d.tolist() for d in out] == [[], []]
    batch.rows[0] += [1, 2, 3, 4, 5]
    assert drafts(copies, batch)[0] == [6, 7, 8, 9, 10]


def build_options(name, keys):
    return method(name).options(**keys)


def test_the_copy_source_option():
    options = build_options("layer_skip", {"copy_source": "suffix_tree"})
    assert options.copy_source == "suffix_tree" and options.prompt_lookup_max == 0
    assert build_options("layer_skip", {}).copy_source == "prompt_lookup"
    with pytest.raises(LayerSkipConfigError, match=r"did you mean \"suffix_tree\""):
        build_options("layer_skip", {"copy_source": "suffix-tree"})
    with pytest.raises(LayerSkipConfigError, match="'prompt_lookup_max' sets prompt lookup's"):
        build_options("layer_skip", {"copy_source": "suffix_tree", "prompt_lookup_max": 4})


def test_a_missing_suffix_tree_says_how_to_install_it(monkeypatch):
    import vllm_layerskip.core.suffix_copies as suffix_copies

    monkeypatch.setattr(suffix_copies, "suffix_tree_available", lambda: False)
    with pytest.raises(LayerSkipConfigError, match="scripts/install_suffix.sh"):
        build_options("quantized", {"copy_source": "suffix_tree"})
