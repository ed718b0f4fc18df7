"""With a KV cache so small that vLLM must preempt and recompute requests, outputs
stay those of plain decoding: the draft engine writes KV only into slots of blocks
the scheduler gave the request (its lookahead slots), never elsewhere."""

from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core.measure import chat_prompts, shutdown, spec_decode_counters

NUM_BLOCKS = 12  # x 128-token blocks on CPU: far less than 8 requests need at once
# (prompts of 42-292 tokens + 100: 3 preemptions in a run, as with 160 tokens)


def workload(llm):
    questions = owned_questions(8)
    return chat_prompts(llm, questions), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)


def preemptions(llm) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))


def test_parity_under_preemption(smollm2_path):
    llm = make_llm(smollm2_path, in_process=True, max_model_len=1024)
    prompts, params = workload(llm)
    plain = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    shutdown(llm)

    config = {"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratio": 0.2,
              "adaptive_draft_length": False}
    llm = make_llm(smollm2_path, in_process=True, speculative_config=config, max_model_len=1024,
                   num_gpu_blocks_override=NUM_BLOCKS)
    try:
        out = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        counters, preempted = spec_decode_counters(llm), preemptions(llm)
    finally:
        shutdown(llm)
    assert preempted > 0, "the cache was large enough: no preemption happened"
    assert counters.drafts > 0
    assert out == plain
