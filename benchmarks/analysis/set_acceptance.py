"""Mean acceptance length M of fixed skip sets on chosen prompts, no timing.

A learned set is only as good as the text it was learned on carries over: this
runs each set as `layer_skip` (K fixed, no prompt lookup, greedy) on the prompts
it was learned on and on prompts it never saw, one engine at a time, and prints
M and alpha per set and prompt group. Greedy drafts are deterministic, so one
run says it; M hardly depends on the dtype, and float32 is the faster one for
a 1.5B model on a CPU without AVX-512 (bench results 2026-11-26).

    .venv/bin/python benchmarks/analysis/set_acceptance.py --model ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct \\
        --sets '{"skip_attn":[2,4],"skip_mlp":[3]}' '{"skip_attn":[5,6],"skip_mlp":[1]}' \\
        --groups learned:0:24 held_out:24:48

Prompt groups are slices of the project's own prompts in the order
`vllm-layerskip learn-swift-set` feeds them (categories taking turns); `spec_bench:N[:CAT,...]`
takes the first N Spec-Bench questions of each category (first turns), as
bench_methods.py picks them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(BENCHMARKS), BENCHMARKS]  # the checkout, benchlib


def prompt_groups(specs: list[str]) -> dict[str, list[str]]:
    from benchlib.workloads import categories_in_order, latency_blocks, load_questions

    from vllm_layerskip.core.measure import interleave_categories
    from vllm_layerskip.tools.prompts import owned_prompts, spec_bench_path

    owned = interleave_categories(owned_prompts())
    groups = {}
    for spec in specs:
        name, *rest = spec.split(":")
        owned_slice = name != "spec_bench" and len(rest) == 2 and all(r.isdigit() for r in rest)
        bench = name == "spec_bench" and (not rest or rest[0].isdigit())
        if not (owned_slice or bench):
            raise SystemExit(
                f"--groups {spec!r}: expected NAME:START:END (a slice of the project's "
                f"prompts, e.g. held_out:24:48) or spec_bench:N[:CAT,CAT] (e.g. spec_bench:5:coding,qa)")
        if name == "spec_bench":
            # spec_bench:N[:cat,cat]: the first N questions of each category, as
            # bench_methods.py picks them (question-major).
            questions = load_questions(spec_bench_path())
            cats = rest[1].split(",") if len(rest) > 1 else categories_in_order(questions)
            per_category = int(rest[0]) if rest else 1
            groups[spec] = [questions[i]["prompt"] for block in latency_blocks(questions, per_category, cats)
                            for i in block.questions]
        else:
            start, end = int(rest[0]), int(rest[1])
            groups[name] = owned[start:end]
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="default: SmolLM2-135M-Instruct, converted")
    parser.add_argument("--sets", nargs="+", required=True,
                        help='skip sets as JSON, {"skip_attn": [...], "skip_mlp": [...]}')
    parser.add_argument("--groups", nargs="+", default=["learned:0:24", "held_out:24:48"],
                        help="NAME:START:END slices of the project's prompts, or spec_bench:N[:CAT,CAT]")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="requests generated together")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; a CPU engine needs a size
    from vllm import LLM, SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, shutdown, spec_decode_counters
    from vllm_layerskip.tools.prepare_model import ensure_default_model

    model = args.model or ensure_default_model()
    groups = prompt_groups(args.groups)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for text in args.sets:
        skip = json.loads(text)
        spec = {"method": "layer_skip", "num_speculative_tokens": args.k, "adaptive_draft_length": False,
                "prompt_lookup_max": 0, **skip}
        llm = LLM(model=model, speculative_config=spec, dtype=args.dtype, enforce_eager=True,
                  max_model_len=2048, disable_log_stats=False, seed=0)
        try:
            for name, questions in groups.items():
                prompts = chat_prompts(llm, questions)
                start, before = time.perf_counter(), spec_decode_counters(llm)
                for i in range(0, len(prompts), args.batch):
                    llm.generate(prompts[i:i + args.batch], params, use_tqdm=False)
                c = spec_decode_counters(llm) - before
                per_pos = " / ".join(f"{a:.3f}" for a in c.acceptance_per_position)
                rows.append((text, name, len(prompts), c.mean_acceptance_length, c.acceptance_rate,
                             per_pos))
                print(f"{name}: M {c.mean_acceptance_length:.2f} alpha {c.acceptance_rate:.2f} "
                      f"per position {per_pos} ({len(prompts)} prompts, "
                      f"{time.perf_counter() - start:.0f} s)", flush=True)
        finally:
            shutdown(llm)
    print(f"\nK = {args.k} fixed, no lookup, greedy, {args.max_tokens} tokens a prompt, {args.dtype}\n")
    print("| set | prompts | n | M | alpha | accepted at position 1 / 2 / ... |\n"
          "|---|---|---:|---:|---:|---|")
    for text, name, n, m, alpha, per_pos in rows:
        print(f"| `{text}` | {name} | {n} | {m:.2f} | {alpha:.2f} | {per_pos} |")


if __name__ == "__main__":
    main()
