"""float32 greedy outputs with `layer_skip`, `swift` and `adadecode` (its shipped
heads) are token-for-token those of plain vLLM on Qwen2.5-Coder-1.5B-Instruct,
the model the speed figures are about (benchmarks/RESULTS.md): a few prompts,
short outputs, drafting at every step where the method drafts.

The engines run one at a time, in this process like most test engines: a
float32 engine of this model holds ~7 GB of weights, and `shutdown` gives them
back before the next one starts (two at once, next to the rest of the suite,
would crowd this 24 GB machine). About 3.5 minutes here (155 s in CI on
2026-11-26 before the adadecode case), most of it four engine start-ups."""

import pytest
from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core.measure import chat_prompts, proposer_stats, shutdown, spec_decode_counters

MAX_TOKENS = 16
MAX_MODEL_LEN = 1024
# Fixed K so that every step drafts (the cost model would choose per step);
# MLP sub-layers of every third layer, the hand-made set the benchmarks use.
FIXED = {"num_speculative_tokens": 3, "adaptive_draft_length": False}
SKIP_MLP = [3, 6, 9, 12, 15, 18, 21, 24]


@pytest.fixture(scope="module")
def qwen_path() -> str:
    from vllm_layerskip.tools.prepare_model import ensure_model

    return ensure_model("qwen2.5-coder-1.5b", quiet=True)


def generate(model: str, spec: dict | None):
    llm = make_llm(model, spec, in_process=True, max_model_len=MAX_MODEL_LEN)
    try:
        # code, prose and a copying task: drafts of both sources get verified
        prompts = chat_prompts(llm, owned_questions(3))
        before = spec_decode_counters(llm)
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                               use_tqdm=False)
        counters = spec_decode_counters(llm) - before
        status = proposer_stats(llm) if spec else {}
        return [list(o.outputs[0].token_ids) for o in outputs], counters, status
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def plain(qwen_path):
    return generate(qwen_path, None)[0]


def test_layer_skip_matches_plain_decoding(qwen_path, plain):
    spec = {"method": "layer_skip", "skip_mlp": SKIP_MLP, **FIXED}  # lookup on: the default
    tokens, counters, status = generate(qwen_path, spec)
    assert tokens == plain
    assert all(len(t) == MAX_TOKENS for t in tokens)
    # Drafting really happened, from the skip set and accepted in part.
    assert counters.draft_tokens > 0 and counters.accepted_tokens > 0
    assert status["verified"]["self"]["draft_tokens"] > 0
    assert status["draft_vocab_size"] == 65536  # the vocabulary shipped for this model


def test_swift_matches_plain_decoding(qwen_path, plain):
    spec = {"method": "swift", "skip_ratio": 0.15, "prompt_lookup_max": 0,
            "draft_vocab_size": 0, **FIXED}
    tokens, counters, status = generate(qwen_path, spec)
    assert tokens == plain
    assert counters.draft_tokens > 0 and counters.accepted_tokens > 0
    assert status["draft_vocab_size"] == 0


def test_adadecode_with_shipped_heads_matches_plain_decoding(qwen_path, plain):
    spec = {"method": "adadecode", "heads": "shipped", "prompt_lookup_max": 0, **FIXED}
    tokens, counters, status = generate(qwen_path, spec)
    assert tokens == plain
    # The heads shipped for this model were found and drafted with, exiting early.
    assert status["adadecode"]["layers"] == [7, 14, 21, 25]
    assert counters.draft_tokens > 0 and counters.accepted_tokens > 0
    assert status["adadecode"]["mean_exit_layer"] < status["adadecode"]["num_layers"]
