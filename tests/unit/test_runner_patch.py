"""The model-runner patch's failure boundary (patches/model_runner.py): a draft
pass contains its own failures (tests/test_sampling.py), anything else the
proposer raises stops the engine with a message naming the method and cause."""

import types

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
