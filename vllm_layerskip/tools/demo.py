"""`vllm-layerskip demo`: plain decoding against a layer-skip method, the two
engines alive side by side, taking turns on each prompt; prints tokens/s,
speedup, acceptance and whether the outputs are identical."""

from __future__ import annotations

import json
import os

DEMO_SPEC = {"method": "layer_skip", "num_speculative_tokens": 4, "skip_ratio": 0.2}


def run_demo(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vllm_layerskip.tools.prepare_model import ensure_default_model
    from vllm_layerskip.core.measure import chat_prompts, shutdown, timed_generate
    from vllm_layerskip.tools.prompts import owned_prompts

    model = args.model or ensure_default_model()
    spec = json.loads(args.speculative_config)
    # The first prompt of each category is timed; another one, outside the
    # timed set (so not in the prefix cache), warms both engines up.
    questions = owned_prompts()
    firsts = {q["category"]: i for i, q in reversed(list(enumerate(questions)))}
    timed = [questions[i] for i in sorted(firsts.values())][: args.num_prompts]
    spare = next(q for i, q in enumerate(questions) if i not in firsts.values())
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    # float32: the only precision in which "same output" is exactly defined.
    engine = dict(model=model, dtype="float32", enforce_eager=True, max_model_len=2048,
                  disable_log_stats=False, seed=0)

    names = ("plain", spec["method"])
    engines = {}
    try:
        for name, config in zip(names, (None, spec)):
            print(f"\n== {name}: building the engine ...", flush=True)
            engines[name] = LLM(**engine, speculative_config=config)
        *prompts, warmup = chat_prompts(engines["plain"], [q["prompt"] for q in timed + [spare]])
        for llm in engines.values():  # first-request costs stay out of the timing
            timed_generate(llm, [warmup], params)
        # One request at a time (the latency setting speculative decoding
        # targets), the two engines taking turns on each prompt, in alternating
        # order: both see the same machine, whatever else runs on it meanwhile.
        results = {name: [] for name in names}
        for i, prompt in enumerate(prompts):
            for name in (names if i % 2 == 0 else names[::-1]):
                results[name].append(timed_generate(engines[name], [prompt], params))
    finally:
        for llm in engines.values():
            shutdown(llm)

    plain, spec_runs = results["plain"], results[spec["method"]]
    tps = lambda runs: sum(r.num_tokens for r in runs) / sum(r.seconds for r in runs)
    drafts = sum(r.counters.drafts for r in spec_runs)
    draft_tokens = sum(r.counters.draft_tokens for r in spec_runs)
    accepted = sum(r.counters.accepted_tokens for r in spec_runs)
    same = [p.token_ids == s.token_ids for p, s in zip(plain, spec_runs)]
    print(f"\nModel: {model}\nSpeculative config: {json.dumps(spec)}")
    print(f"Prompts: {len(timed)} of the project's prompts "
          f"({', '.join(q['category'] for q in timed)}), {args.max_tokens} new tokens, batch 1, "
          "the two engines taking turns")
    print(f"{'':24}{'plain':>10}{spec['method']:>14}")
    print(f"{'tokens/s':24}{tps(plain):>10.1f}{tps(spec_runs):>14.1f}")
    print(f"{'speedup over plain':24}{1.0:>10.2f}{tps(spec_runs) / tps(plain):>14.2f}")
    print(f"{'mean acceptance length':24}{'':>10}{1 + accepted / max(drafts, 1):>14.2f}")
    print(f"{'draft acceptance rate':24}{'':>10}{accepted / max(draft_tokens, 1):>14.1%}")
    print(f"Outputs identical to plain decoding: {sum(same)}/{len(same)} prompts")
    return 0 if all(same) else 1
