#!/usr/bin/env python3
"""Record, or compare, what every layer-skip method produces on SmolLM2 (float32,
greedy, fixed draft length): output tokens and vLLM's draft counters per method.

A refactoring that keeps behaviour gives the same file: the tokens always (they
are plain decoding's), and the draft counts for every method whose drafting does
not depend on wall-clock time (swift's optimizer runs in a thread, so its counts
may differ between runs; its tokens may not).

    scripts/method_parity.py --out before.json
    scripts/method_parity.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize in two sentences: The river rose after three days of rain. The town "
    "moved its market to the hill, and the bakers sold bread from their carts.",
    "What is 17 times 23? Explain step by step.",
    "Give three tips for a good night's sleep.",
    "Repeat this list exactly: apple, pear, plum, apple, pear, plum, apple, pear.",
    "Translate to French: The weather is nice today.",
]
FIXED = {"adaptive_draft_length": False}
METHODS = {
    "layer_skip": {"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratio": 0.2, **FIXED},
    "layer_skip_adaptive": {"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratio": 0.2},
    "swift": {"method": "swift", "num_speculative_tokens": 4, **FIXED},
    "clasp": {"method": "clasp", "num_speculative_tokens": 4, "max_optimizer_share": 1.0, **FIXED},
    "self_sd": {"method": "self_sd", "num_speculative_tokens": 4, "profile": "shipped", **FIXED},
    "adadecode": {"method": "adadecode", "num_speculative_tokens": 4, "heads": "shipped", **FIXED},
    "quantized": {"method": "quantized", "num_speculative_tokens": 4, **FIXED},
}
# Drafting that depends on time (thread, cost model): only tokens are compared.
TIMING_DEPENDENT = {"swift", "layer_skip_adaptive"}


def run(model: str, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, shutdown, spec_decode_counters

    result = {}
    for name, spec in [("plain", None), *METHODS.items()]:
        llm = LLM(model=model, speculative_config=spec, dtype="float32", enforce_eager=True,
                  disable_log_stats=False, seed=0, max_model_len=1024)
        prompts = chat_prompts(llm, PROMPTS)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens),
                            use_tqdm=False)
        c = spec_decode_counters(llm)
        result[name] = {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "drafts": c.drafts, "draft_tokens": c.draft_tokens, "accepted": c.accepted_tokens,
        }
        print(f"{name}: drafts {c.drafts}, draft tokens {c.draft_tokens}, accepted "
              f"{c.accepted_tokens}", flush=True)
        shutdown(llm)
    return result


def compare(now: dict, before: dict) -> list[str]:
    problems = []
    for name, b in before.items():
        n = now.get(name)
        if n is None:
            problems.append(f"{name}: missing")
            continue
        if n["tokens"] != b["tokens"]:
            problems.append(f"{name}: tokens differ")
        if name not in TIMING_DEPENDENT and name != "plain":
            for key in ("drafts", "draft_tokens", "accepted"):
                if n[key] != b[key]:
                    problems.append(f"{name}: {key} {n[key]} vs {b[key]} before")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--compare", help="a file written earlier by this script")
    p.add_argument("--model", help="default: the prepared SmolLM2-135M-Instruct")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    from vllm_layerskip.tools.prepare_model import ensure_default_model

    result = run(args.model or ensure_default_model(quiet=True), args.max_tokens)
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.compare:
        with open(args.compare) as f:
            problems = compare(result, json.load(f))
        print("\n".join(problems) or "same tokens and draft counts as " + args.compare)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
