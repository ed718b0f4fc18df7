"""Every supported model family loads and drafts with parity: tiny random
Llama, Mistral, Qwen2 and Qwen3 checkpoints, float32 greedy, plain vs layer_skip
(with attention and MLP sub-layers skipped)."""

import pytest
from conftest import make_llm
from vllm import SamplingParams

from vllm_layerskip.core.measure import shutdown, spec_decode_counters

PROMPTS = ["Hello world", "The history of the Roman empire in one long sentence: " * 4, "1 2 3"]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def generate(llm):
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_family_parity(tiny_model_dir, family):
    path = tiny_model_dir(family, num_layers=4, out_proj_std=0.025)
    llm = make_llm(path, in_process=True, max_model_len=256)
    plain = generate(llm)
    shutdown(llm)

    config = {"method": "layer_skip", "num_speculative_tokens": 3, "adaptive_draft_length": False, "skip_attn": [2], "skip_mlp": [1]}
    llm = make_llm(path, in_process=True, speculative_config=config, max_model_len=256)
    try:
        spec = generate(llm)
        counters = spec_decode_counters(llm)
    finally:
        shutdown(llm)
    assert spec == plain
    # Drafts are meaningful (some accepted) and verification matters (some rejected).
    assert 0 < counters.accepted_tokens < counters.draft_tokens, counters
