"""The model-runner patch's failure boundary (patches/model_runner.py): a draft
pass contains its own failures (tests/test_sampling.py), anything else the
proposer raises stops the engine with a message naming the method and cause."""

import types

import numpy as np

import pytest

from vllm_layerskip.patches import model_runner
from vllm_layerskip.methods.layer_skip.proposer import LayerSkipProposer


class BrokenBookkeeping(LayerSkipProposer):
    def __init__(self):  # no engine: only the failure path is exercised
        self.method = "layer_skip"

    def propose_from_runner(self, runner, sampled_token_ids, scheduler_output=None):
        raise KeyError("req-7")


def test_a_failure_outside_the_draft_pass_stops_the_engine_with_a_clear_message():
    runner = types.SimpleNamespace(drafter=BrokenBookkeeping(), _draft_probs="untouched")
    with pytest.raises(RuntimeError) as info:
        model_runner.propose_draft_token_ids(runner, None, [[11]])
    message = str(info.value)
    assert "'layer_skip' proposer failed outside a draft pass (KeyError: 'req-7')" in message
    assert "restart without --speculative-config" in message
    assert isinstance(info.value.__cause__, KeyError)
    assert runner._draft_probs == "untouched"  # nothing half-handed to vLLM


def _engine_of(drafter):
    """A stand-in LLM whose collective_rpc runs the function on one worker."""
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(drafter=drafter))
    return types.SimpleNamespace(collective_rpc=lambda fn, args=(): [fn(worker, *args)])


def test_pausing_an_engine_without_a_layer_skip_proposer_says_what_to_do():
    from vllm_layerskip.core.measure import set_drafting_paused

    with pytest.raises(ValueError, match="no vllm-layerskip proposer to pause; start it with a "
                                         "layer-skip method"):
        set_drafting_paused(_engine_of(None), True)


def test_a_paused_proposer_drafts_nothing_and_learns_nothing():
    proposer = object.__new__(LayerSkipProposer)  # no engine: a paused step needs none
    proposer._last_drafted = {"req-1": (0, 3)}
    proposer._last_end = 12.5
    proposer.set_drafting_paused(True)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["req-1", "req-2"]))
    result = proposer.propose_from_runner(runner, [[5, 6], [7]])
    assert result.token_ids == [[], []] and result.num_forward_steps == 0
    # Nothing carried across the pause: no acceptance nor step time is learned
    # from the first step after it.
    assert proposer._last_drafted == {} and proposer._last_end is None


def test_pausing_prompt_lookup_leaves_the_self_draft_and_says_when_lookup_is_off():
    from vllm_layerskip.core.measure import set_prompt_lookup_paused

    from vllm_layerskip.core.lookup import PromptLookup

    proposer = object.__new__(LayerSkipProposer)
    proposer.copies = PromptLookup(max_n=4, min_n=2)
    proposer.prompt_lookup_paused = False
    # A context that repeats: [1 2 3 4 1 2] -> lookup copies "3 4 1 2" after "1 2".
    batch = types.SimpleNamespace(token_ids_cpu=np.array([[1, 2, 3, 4, 1, 2, 0, 0]]),
                                  num_tokens_no_spec=np.array([6]))
    runner = types.SimpleNamespace(input_batch=batch)
    requests = types.SimpleNamespace(rows=np.array([0]), budget=np.array([4]))
    assert proposer._lookup(runner, requests)[0].tolist() == [3, 4, 1, 2]
    set_prompt_lookup_paused(_engine_of(proposer), True)
    assert proposer.prompt_lookup_paused
    assert proposer._lookup(runner, requests)[0].tolist() == []  # the method drafts alone
    set_prompt_lookup_paused(_engine_of(proposer), False)
    assert proposer._lookup(runner, requests)[0].tolist() == [3, 4, 1, 2]

    proposer.copies = None  # prompt_lookup_max 0
    with pytest.raises(ValueError, match="prompt lookup is off in this engine, so there is "
                                         "nothing to pause: start it with prompt_lookup_max"):
        set_prompt_lookup_paused(_engine_of(proposer), True)
    with pytest.raises(ValueError, match="no vllm-layerskip proposer to pause"):
        set_prompt_lookup_paused(_engine_of(None), True)


def test_a_server_started_with_drafting_paused_drafts_nothing(monkeypatch, caplog):
    """`vllm serve` has no collective_rpc for set_drafting_paused: the engine of a
    server whose environment sets DRAFTING_PAUSED_ENV starts paused
    (benchmarks/bench_serve.py --draft-length paused), and says so."""
    from vllm_layerskip.core import proposer as base
    from vllm_layerskip.core.measure import DRAFTING_PAUSED_ENV
    from vllm_layerskip.core.options import DraftingOptions

    monkeypatch.setattr(base, "DraftEngine", lambda config, k: None)  # no model here
    monkeypatch.setattr(base, "get_selection", lambda spec: types.SimpleNamespace(
        method="quantized", options=DraftingOptions()))
    config = types.SimpleNamespace(speculative_config=types.SimpleNamespace(num_speculative_tokens=4))
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["req-1"]))
    assert not LayerSkipProposer(config).drafting_paused
    monkeypatch.setenv(DRAFTING_PAUSED_ENV, "1")
    with caplog.at_level("WARNING", logger="vllm.layerskip"):
        proposer = LayerSkipProposer(config)
    assert proposer.drafting_paused
    assert f"quantized: drafting paused from the start ({DRAFTING_PAUSED_ENV}=1)" in caplog.text
    assert proposer.propose_from_runner(runner, [[5]]).token_ids == [[]]
    monkeypatch.setenv(DRAFTING_PAUSED_ENV, "0")
    assert not LayerSkipProposer(config).drafting_paused
    # A value that is neither: the engine does not start, and says what to set.
    monkeypatch.setenv(DRAFTING_PAUSED_ENV, "true")
    with pytest.raises(ValueError) as info:
        LayerSkipProposer(config)
    assert str(info.value) == (f"{DRAFTING_PAUSED_ENV}='true': expected 1 (start with drafting "
                               "paused) or 0 / unset (draft); set it to one of those")
