"""`"draft_weights": "w8a8"` in bf16, the dtype users run: on an AVX512-VNNI CPU the
copies run vLLM's own int8 kernel (core/w8a8_kernels.py), which the float32
parity tests never reach (it takes bf16 only). Outputs are verified by the
model's own weights whatever the kernel; what a wrong kernel would show is
drafts that are not accepted, so this checks the kernel the engine picked and
that its drafts through every layer are accepted as a close copy's are."""

import pytest
from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core import w8a8_kernels
from vllm_layerskip.core.measure import chat_prompts, proposer_stats, shutdown, spec_decode_counters

pytestmark = pytest.mark.skipif(not w8a8_kernels.vnni_kernel_available(),
                                reason="vLLM's int8 kernel needs an AVX512-VNNI CPU")

SPEC = {"method": "quantized", "draft_weights": "w8a8", "num_speculative_tokens": 4,
        "adaptive_draft_length": False, "prompt_lookup_max": 0}


def test_bf16_w8a8_drafts_run_vllms_int8_kernel_and_are_accepted(smollm2_path):
    llm = make_llm(smollm2_path, SPEC, in_process=True, dtype="bfloat16", max_model_len=512)
    try:
        prompts = chat_prompts(llm, owned_questions(6))
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40),
                               use_tqdm=False)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)
    finally:
        shutdown(llm)
    assert all(o.outputs[0].token_ids for o in outputs)
    assert status["draft_weights"]["kernels"] == ["vnni"], status["draft_weights"]
    assert counters.drafts > 20, counters
    # The float32 case with FBGEMM's kernel holds the same bound (test_parity_smollm2.py).
    assert counters.acceptance_rate >= 0.5, counters
