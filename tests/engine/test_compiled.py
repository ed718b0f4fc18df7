"""The user's default engine: `vllm serve` and `LLM(...)` without enforce_eager
compile the model (torch.compile, inductor on the CPU), while the draft passes
call the decoder's sub-modules eagerly (core/model_adapter.py). The rest of the
suite runs eager engines; here float32 greedy outputs of compiled engines with
`layer_skip` must be token-for-token those of a compiled plain engine, and a
draft through every layer must agree with the compiled target: the eager draft
reads the K/V the compiled target wrote."""

import pytest
from conftest import make_llm, owned_questions
from vllm import SamplingParams
from vllm.config import CompilationMode

from vllm_layerskip.core.measure import chat_prompts, proposer_stats, shutdown, spec_decode_counters

MAX_MODEL_LEN = 512
COMPILED = dict(enforce_eager=False, max_model_len=MAX_MODEL_LEN)
PARAMS = SamplingParams(temperature=0, max_tokens=40)
# Nothing skipped, full head, every step drafts K = 4: the draft is the target
# run eagerly, so a disagreement is a K/V or position mismatch between the two
# modes, not a skipped layer. (Which sub-layers a draft skips is the same eager
# code in both modes, tested on eager engines. Each compiled engine costs about
# a minute of CI here, compiling anew: one besides plain.)
SPEC = {"method": "layer_skip", "num_speculative_tokens": 4, "adaptive_draft_length": False,
        "prompt_lookup_max": 0, "draft_vocab_size": 0}


def run(llm) -> list[list[int]]:
    prompts = chat_prompts(llm, owned_questions(4))
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


@pytest.fixture(scope="module")
def plain(smollm2_path):
    llm = make_llm(smollm2_path, in_process=True, **COMPILED)
    try:
        compilation = llm.llm_engine.vllm_config.compilation_config
        # What vLLM's CPU platform makes of the default: one Dynamo trace, inductor.
        assert compilation.mode == CompilationMode.DYNAMO_TRACE_ONCE, compilation.mode
        assert compilation.backend == "inductor", compilation.backend
        return run(llm)
    finally:
        shutdown(llm)


def test_compiled_greedy_parity(smollm2_path, plain):
    llm = make_llm(smollm2_path, in_process=True, speculative_config=SPEC, **COMPILED)
    try:
        out = run(llm)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)
    finally:
        shutdown(llm)
    assert out == plain
    assert counters.drafts > 20, counters
    assert counters.acceptance_rate >= 0.95, counters
    # The proposer's time: its draft passes and, around them, its own per-step work.
    assert status["propose_seconds"] > status["draft_seconds"] > 0, status
