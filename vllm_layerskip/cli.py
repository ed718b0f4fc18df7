"""`vllm-layerskip` command: prepare the default model, run the demo.

    vllm-layerskip prepare-model     # convert SmolLM2-135M-Instruct once, print its path
    vllm-layerskip demo              # plain vs layer_skip on Spec-Bench prompts
    vllm-layerskip search --out P    # Self-SD: Bayesian search of a skip profile
    vllm-layerskip train-heads --prompts F --layers 8,15,22 --out H   # AdaDecode exit heads
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEMO_SPEC = {"method": "layer_skip", "num_speculative_tokens": 4, "skip_ratio": 0.2}


def _demo(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vllm_layerskip.default_model import ensure_default_model
    from vllm_layerskip.measure import chat_prompts, load_spec_bench, shutdown, timed_generate

    model = args.model or ensure_default_model()
    spec = json.loads(args.speculative_config)
    questions = load_spec_bench(per_category=1)[: args.num_prompts]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    # float32: the only precision in which "same output" is exactly defined.
    engine = dict(model=model, dtype="float32", enforce_eager=True, max_model_len=2048,
                  disable_log_stats=False, seed=0)

    results = {}
    for name, config in (("plain", None), (spec["method"], spec)):
        print(f"\n== {name}: building the engine ...", flush=True)
        llm = LLM(**engine, speculative_config=config)
        prompts = chat_prompts(llm, [q["prompt"] for q in questions])
        timed_generate(llm, prompts[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        # One request at a time: the latency setting speculative decoding targets.
        runs = [timed_generate(llm, [p], params) for p in prompts]
        results[name] = runs
        shutdown(llm)

    plain, spec_runs = results["plain"], results[spec["method"]]
    tps = lambda runs: sum(r.num_tokens for r in runs) / sum(r.seconds for r in runs)
    drafts = sum(r.counters.drafts for r in spec_runs)
    draft_tokens = sum(r.counters.draft_tokens for r in spec_runs)
    accepted = sum(r.counters.accepted_tokens for r in spec_runs)
    same = [p.token_ids == s.token_ids for p, s in zip(plain, spec_runs)]
    print(f"\nModel: {model}\nSpeculative config: {json.dumps(spec)}")
    print(f"Prompts: {len(questions)} Spec-Bench questions "
          f"({', '.join(q['category'] for q in questions)}), {args.max_tokens} new tokens, batch 1")
    print(f"{'':24}{'plain':>10}{spec['method']:>14}")
    print(f"{'tokens/s':24}{tps(plain):>10.1f}{tps(spec_runs):>14.1f}")
    print(f"{'speedup over plain':24}{1.0:>10.2f}{tps(spec_runs) / tps(plain):>14.2f}")
    print(f"{'mean acceptance length':24}{'':>10}{1 + accepted / max(drafts, 1):>14.2f}")
    print(f"{'draft acceptance rate':24}{'':>10}{accepted / max(draft_tokens, 1):>14.1%}")
    print(f"Outputs identical to plain decoding: {sum(same)}/{len(same)} prompts")
    return 0 if all(same) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-layerskip", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare-model", help="convert the default model (cached) and print its path")
    demo = sub.add_parser("demo", help="plain vs speculative decoding on the default model")
    demo.add_argument("--model", help="model path (default: SmolLM2-135M-Instruct, converted)")
    demo.add_argument("--speculative-config", default=json.dumps(DEMO_SPEC),
                      help=f"JSON, as for vllm serve (default: {json.dumps(DEMO_SPEC)})")
    demo.add_argument("--num-prompts", type=int, default=4)
    demo.add_argument("--max-tokens", type=int, default=96)
    from vllm_layerskip.search import add_arguments

    search = sub.add_parser("search", help="Bayesian search of a skip set; writes a profile "
                                           "for method self_sd")
    add_arguments(search)
    from vllm_layerskip import heads_training

    train_heads = sub.add_parser("train-heads", help="train AdaDecode exit heads (model frozen); "
                                                     "writes a heads file for method adadecode")
    heads_training.add_arguments(train_heads)
    args = parser.parse_args(argv)

    if args.command == "train-heads":
        heads_training.run_train_heads(args)
        return 0

    if args.command == "search":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm_layerskip.search import run_search

        run_search(args)
        return 0

    if args.command == "prepare-model":
        from vllm_layerskip.default_model import ensure_default_model

        print(ensure_default_model())
        return 0
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
