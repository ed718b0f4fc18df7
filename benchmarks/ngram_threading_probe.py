"""vLLM's `ngram` against plain on two writing prompts where ngram finds few matches,
seconds per output token; run once per numba threading layer to see the layer's cost.

    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv/bin/python benchmarks/ngram_threading_probe.py plain
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv/bin/python benchmarks/ngram_threading_probe.py ngram
    NUMBA_THREADING_LAYER=workqueue VLLM_CPU_OMP_THREADS_BIND=0-1 \
        .venv/bin/python benchmarks/ngram_threading_probe.py ngram

2026-11-27, 2-core AVX2 CPU, Qwen2.5-Coder-1.5B-Instruct float32: plain 0.63-0.64 s a
token; ngram 0.96-1.18 with numba's default (OpenMP) layer, 0.68-0.70 with workqueue.
"""

import os
import sys
import time

PROMPTS = ["Write a short poem about autumn leaves falling in a quiet park.",
           "Compose a limerick about a cat who learns to play the violin."]


def main() -> None:
    from vllm import LLM, SamplingParams

    from vllm_layerskip.tools.prepare_model import ensure_model

    method = sys.argv[1] if len(sys.argv) > 1 else "ngram"
    # A checkpoint directory, or the prepared Qwen model (honours VLLM_LAYERSKIP_CACHE;
    # prepared first if missing, as `vllm-layerskip prepare-model` does).
    model = sys.argv[2] if len(sys.argv) > 2 else ensure_model("qwen2.5-coder-1.5b", quiet=True)
    spec = None if method == "plain" else {"method": "ngram", "num_speculative_tokens": 8,
                                           "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    llm = LLM(model, dtype="float32", enforce_eager=True, max_model_len=2048,
              speculative_config=spec)
    llm.chat([{"role": "user", "content": PROMPTS[0]}], SamplingParams(temperature=0, max_tokens=8))
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for prompt in PROMPTS:
        start = time.perf_counter()
        llm.chat([{"role": "user", "content": prompt}], params)
        print(f"{method}, numba layer {os.environ.get('NUMBA_THREADING_LAYER', 'default')}: "
              f"{(time.perf_counter() - start) / 48:.3f} s a token", flush=True)


if __name__ == "__main__":
    main()
