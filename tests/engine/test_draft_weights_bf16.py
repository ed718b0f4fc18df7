"""Draft weights in bf16, the dtype users run: on an AVX512-VNNI CPU `"w8a8"`
copies run vLLM's own int8 kernel (core/w8a8_kernels.py) and `"int4"` copies
the project's (core/int4_kernels.py), which the float32 parity tests never reach
(both take bf16 only). Outputs are verified by the model's own weights whatever
the kernel; what a wrong kernel would show is drafts that are not accepted, so
this checks the kernels the engine picked and that its drafts through every
layer are accepted as a close copy's are."""

import pytest
from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core import int4_kernels, w8a8_kernels
from vllm_layerskip.core.measure import chat_prompts, proposer_stats, shutdown, spec_decode_counters

CASES = [
    # SmolLM2's hidden size, 576, is not a multiple of the int4 kernel's 128-column
    # chunks: only down_proj (1536 columns) runs it, the rest torch's kernel.
    pytest.param("int4", ["int4 torch", "int4 vnni"], id="int4",
                 marks=pytest.mark.skipif(int4_kernels.library() is None,
                                          reason="the int4 kernel needs AVX512-VNNI and gcc")),
    pytest.param("w8a8", ["w8a8 vnni"], id="w8a8",
                 marks=pytest.mark.skipif(not w8a8_kernels.vnni_kernel_available(),
                                          reason="vLLM's int8 kernel needs an AVX512-VNNI CPU")),
]


@pytest.mark.parametrize("scheme,kernels", CASES)
def test_bf16_drafts_run_the_vnni_kernels_and_are_accepted(smollm2_path, scheme, kernels):
    spec = {"method": "quantized", "draft_weights": scheme, "num_speculative_tokens": 4,
            "adaptive_draft_length": False, "prompt_lookup_max": 0}
    llm = make_llm(smollm2_path, spec, in_process=True, dtype="bfloat16", max_model_len=512)
    try:
        prompts = chat_prompts(llm, owned_questions(6))
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40),
                               use_tqdm=False)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)
    finally:
        shutdown(llm)
    assert all(o.outputs[0].token_ids for o in outputs)
    assert status["draft_weights"]["kernels"] == kernels, status["draft_weights"]
    assert counters.drafts > 20, counters
    # The float32 case with torch's and FBGEMM's kernels holds the same bound
    # (test_parity_smollm2.py).
    assert counters.acceptance_rate >= 0.5, counters
