"""patches/engine_core.py: a layer-skip drafter's drafts reach the scheduler with
the step's output, and the engine core no longer calls the worker for them."""

from conftest import make_llm
from vllm import SamplingParams

from vllm_layerskip.core.measure import shutdown, spec_decode_counters


def test_drafts_reach_the_scheduler_without_a_call_to_the_worker(tiny_model_dir):
    # No skip set and a fixed draft length: the draft is the full model, so
    # every draft token must be accepted, which it can only be if the
    # scheduler got the drafts.
    llm = make_llm(
        tiny_model_dir("llama", num_layers=4),
        {"method": "layer_skip", "num_speculative_tokens": 3, "adaptive_draft_length": False},
        in_process=True, max_model_len=256,
    )
    core = llm.llm_engine.engine_core.engine_core
    take = core.model_executor.take_draft_token_ids
    calls = []
    core.model_executor.take_draft_token_ids = lambda: calls.append(1) or take()
    try:
        outputs = llm.generate(["The quick brown fox", "Once upon a time"],
                               SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        counters = spec_decode_counters(llm)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [20, 20]
        assert counters.draft_tokens > 0
        assert counters.accepted_tokens == counters.draft_tokens
        assert calls == []  # vLLM's own post_step would call it once per step
    finally:
        shutdown(llm)
