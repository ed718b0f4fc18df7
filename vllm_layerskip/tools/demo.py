"""`vllm-layerskip demo`: plain decoding against a layer-skip method, the two
engines alive side by side, taking turns on each prompt; prints tokens/s,
speedup, acceptance, where the drafts came from, and whether the outputs are
identical.

Two settings, by model:
- qwen2.5-coder-1.5b (default): the speedup a user comes for, in bfloat16 (the
  dtype users run), method `quantized`: every layer drafts on int4 draft weights
  (docs/draft-weights.md); about 4-5 minutes on 2 CPU cores, most of it plain
  decoding at ~4.5 tokens/s. In bf16 a verify pass over several tokens rounds differently
  from one-token decoding, so a few tokens may differ from plain decoding (as
  for vLLM's own ngram); exactness is tested in float32 (tests/engine).
- smollm2-135m: a quick check (about a minute) in float32, where the outputs
  are identical to plain decoding token for token. No skip set makes this
  small model faster on a CPU; the cost model then keeps drafting to what pays.
"""

from __future__ import annotations

import json
import os
import time

from vllm_layerskip.tools.cpu_threads import bind_every_core

# The demo's configuration is the one `vllm-layerskip recommend` prints for the
# model and dtype (tools/recommend.py): bf16 on a CPU with bf16 arithmetic, the
# whole model as its own draft on int4 weights; float32, the shipped self_sd profile.
SETTINGS = {  # by catalog name: dtype, prompts timed, new tokens
    "qwen2.5-coder-1.5b": ("bfloat16", ["coding", "code_edit", "summarization", "rag"], 128),
    "smollm2-135m": ("float32", ["coding", "code_edit", "summarization", "rag", "writing", "math"], 96),
}
DEFAULT_DEMO_MODEL = "qwen2.5-coder-1.5b"


def default_spec(model: str | None, dtype: str) -> tuple[dict, str]:
    """(speculative config, dtype) the demo runs: recommend()'s for the model."""
    from vllm_layerskip.tools.recommend import recommend

    result = recommend(model, dtype)
    return result.spec, result.dtype


def run_demo(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    bind_every_core()  # on 2 cores vLLM would keep one back from the worker: half the speed
    from vllm import LLM, SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, proposer_stats, shutdown, timed_generate
    from vllm_layerskip.tools.prepare_model import CATALOG, ensure_model
    from vllm_layerskip.tools.prompts import owned_prompts

    name = args.model or DEFAULT_DEMO_MODEL
    dtype, categories, max_tokens = SETTINGS.get(name, ("bfloat16", None, 128))
    model = ensure_model(name) if name in CATALOG else name
    dtype = args.dtype or dtype
    max_tokens = args.max_tokens or max_tokens
    if args.speculative_config:
        spec = json.loads(args.speculative_config)
    else:
        spec, dtype = default_spec(model, dtype)
    # The first prompt of each category is timed; another one, outside the
    # timed set (so not in the prefix cache), warms both engines up.
    questions = owned_prompts()
    firsts = {q["category"]: i for i, q in reversed(list(enumerate(questions)))}
    timed = [questions[i] for i in sorted(firsts.values())
             if categories is None or questions[i]["category"] in categories][: args.num_prompts]
    spare = next(q for i, q in enumerate(questions) if i not in firsts.values())
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    engine = dict(model=model, dtype=dtype, enforce_eager=True, max_model_len=4096,
                  disable_log_stats=False, seed=0)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # proposer_stats

    started = time.perf_counter()
    names = ("plain", spec["method"])
    engines = {}
    try:
        for label, config in zip(names, (None, spec)):
            print(f"\n== {label}: building the engine ({dtype}) ...", flush=True)
            engines[label] = LLM(**engine, speculative_config=config)
        *prompts, warmup = chat_prompts(engines["plain"], [q["prompt"] for q in timed + [spare]])
        for llm in engines.values():  # first-request costs stay out of the timing
            timed_generate(llm, [warmup], params)
        # One request at a time (the latency setting speculative decoding
        # targets), the two engines taking turns on each prompt, in alternating
        # order: both see the same machine, whatever else runs on it meanwhile.
        results = {label: [] for label in names}
        for i, prompt in enumerate(prompts):
            for label in (names if i % 2 == 0 else names[::-1]):
                results[label].append(timed_generate(engines[label], [prompt], params))
                print(f"   {timed[i]['category']:14s} {label:10s} "
                      f"{results[label][-1].tokens_per_second:6.2f} tokens/s", flush=True)
        status = proposer_stats(engines[spec["method"]])
    finally:
        for llm in engines.values():
            shutdown(llm)

    plain, spec_runs = results["plain"], results[spec["method"]]
    tps = lambda runs: sum(r.num_tokens for r in runs) / sum(r.seconds for r in runs)
    drafts = sum(r.counters.drafts for r in spec_runs)
    draft_tokens = sum(r.counters.draft_tokens for r in spec_runs)
    accepted = sum(r.counters.accepted_tokens for r in spec_runs)
    same = [p.token_ids == s.token_ids for p, s in zip(plain, spec_runs)]
    verified = status.get("verified", {})
    print(f"\nModel: {model} ({dtype})\nSpeculative config: {json.dumps(spec)}")
    print(f"Prompts: {len(timed)} of the project's prompts "
          f"({', '.join(q['category'] for q in timed)}), {max_tokens} new tokens, batch 1, "
          "the two engines taking turns")
    print(f"{'':24}{'plain':>10}{spec['method']:>14}")
    print(f"{'tokens/s':24}{tps(plain):>10.2f}{tps(spec_runs):>14.2f}")
    print(f"{'speedup over plain':24}{1.0:>10.2f}{tps(spec_runs) / tps(plain):>14.2f}")
    print(f"{'mean acceptance length':24}{'':>10}{1 + accepted / max(drafts, 1):>14.2f}")
    print(f"{'draft acceptance rate':24}{'':>10}{accepted / max(draft_tokens, 1):>14.1%}")
    for source, label in (("self", "drafted by the method"), ("lookup", "copied from context")):
        counts = verified.get(source) or {}
        if counts.get("draft_tokens"):
            print(f"  {label:22}{'':>10}{counts['draft_tokens']:>8} tokens, "
                  f"{counts['acceptance']:.0%} accepted")
    print(f"Outputs identical to plain decoding: {sum(same)}/{len(same)} prompts"
          + ("" if dtype == "float32" else " (bf16: see the note in `vllm-layerskip demo --help`)"))
    print(f"Demo time: {time.perf_counter() - started:.0f} s")
    return 0 if all(same) or dtype != "float32" else 1
