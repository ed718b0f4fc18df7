"""A request near max_model_len must not cost the rest of the batch its drafts.

vLLM 0.32 skips the drafter for the whole batch once any request is within K
tokens of max_model_len and schedules K zero tokens per request as drafts
instead; they are verified (K extra tokens per request) and rejected. The plugin
drafts for every request and caps each draft at max_model_len itself
(patches/model_runner.py). With nothing skipped the draft is the target model,
so every real draft is accepted: any rejected draft token here is a zero draft.
"""

import numpy as np
from conftest import make_llm
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from vllm_layerskip.core.measure import shutdown, spec_decode_counters

MAX_MODEL_LEN = 128
K = 4


def prompts():
    rng = np.random.default_rng(0)
    # The long request reaches the last K positions while the short ones still
    # generate, and stays there for several steps.
    lengths = [112, 9, 14, 20]
    return [TokensPrompt(prompt_token_ids=rng.integers(100, 5000, n).tolist()) for n in lengths]


def generate(llm):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = llm.generate(prompts(), params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outputs]


def test_batch_keeps_drafting_next_to_a_request_at_max_model_len(tiny_model_dir):
    # No plain engine: with nothing skipped every real draft is the target's own
    # prediction, so the checks below need none (test_parity_smollm2 compares
    # outputs with plain decoding for a request that runs into max_model_len).
    path = tiny_model_dir("llama", num_layers=4, out_proj_std=0.025)
    # Lookup off: a copied draft can be rejected, and this test counts on every
    # real draft being accepted.
    config = {"method": "layer_skip", "num_speculative_tokens": K, "sublayer_skip_ratio": 0,
              "adaptive_draft_length": False, "prompt_lookup_max": 0}
    llm = make_llm(path, in_process=True, speculative_config=config, max_model_len=MAX_MODEL_LEN)
    try:
        spec = generate(llm)
        counters = spec_decode_counters(llm)
    finally:
        shutdown(llm)

    long_ids, long_finish = spec[0]
    assert len(long_ids) == MAX_MODEL_LEN - 112 and long_finish == "length"
    assert [len(ids) for ids, _ in spec[1:]] == [40, 40, 40]
    assert counters.draft_tokens > 0
    # Without the patch (measured): 12 of 120 draft tokens were zero drafts, all
    # rejected; 108 accepted.
    assert counters.accepted_tokens == counters.draft_tokens, counters
