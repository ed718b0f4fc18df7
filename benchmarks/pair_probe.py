"""Two engines side by side, prompt by prompt: where one loses time against the other.

bench_methods.py gives speedups with intervals; this prints, for one pair of
engines taking turns on the same prompts (one question per Spec-Bench category
by default, the order alternating), each prompt's decode time per token for
both, and for a plugin engine how its time splits: draft passes, the
proposer's own work around them, what its cost model measured. Useful to tell
per-step overheads from drift (the per-prompt rows show how far two turns of
the same prompt a few seconds apart differ) and to compare eager with compiled
engines (`--compile-b`).

    .venv/bin/python benchmarks/pair_probe.py --b '{"method": "layer_skip", "skip_attn": [], "skip_mlp": [0]}'
    .venv/bin/python benchmarks/pair_probe.py --b plain --compile-b        # eager plain vs compiled plain
    .venv/bin/python benchmarks/pair_probe.py --compile-a --compile-b --b '{"method": "self_sd", "profile": "shipped"}'

A and B: "plain", or a speculative config as JSON (K defaults to --k).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the prepared Qwen2.5-Coder-1.5B-Instruct")
    p.add_argument("--a", default="plain", help='"plain" or a speculative config (JSON)')
    p.add_argument("--b", required=True, help='"plain" or a speculative config (JSON)')
    p.add_argument("--compile-a", action="store_true", help="engine A compiled (vLLM's default)")
    p.add_argument("--compile-b", action="store_true", help="engine B compiled (vLLM's default)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--prompts", type=int, default=13, help="questions, categories taking turns")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dataset-path", default=None)
    return p.parse_args(argv)


def spec_of(text: str, k: int) -> dict | None:
    if text == "plain":
        return None
    spec = json.loads(text)
    spec.setdefault("num_speculative_tokens", k)
    return spec


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the proposer's status by RPC
    from vllm_layerskip.tools.cpu_threads import bind_every_core

    bind_every_core(os.environ)
    from benchlib.configs import Config, plugin_methods_available
    from benchlib.engines import Engine
    from vllm import SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, interleave_categories, read_questions
    from vllm_layerskip.tools.prepare_model import ensure_model
    from vllm_layerskip.tools.prompts import benchmark_dataset

    model = args.model or ensure_model("qwen2.5-coder-1.5b", quiet=True)
    engines = []
    for label, text, compiled in (("A", args.a, args.compile_a), ("B", args.b, args.compile_b)):
        spec = spec_of(text, args.k)
        method = spec["method"] if spec else "plain"
        family = ("plain" if spec is None
                  else "plugin" if method in plugin_methods_available() else "vllm")
        name = f"{label}: {method}{' compiled' if compiled else ''}"
        engine = Engine(Config(name=name, method=method, spec=spec, family=family), model,
                        dict(dtype=args.dtype, enforce_eager=not compiled, max_model_len=2048, seed=0))
        engine.start()
        engines.append(engine)
    questions = read_questions(benchmark_dataset(args.dataset_path))
    prompts = chat_prompts(engines[0].llm, interleave_categories(questions)[: args.prompts])
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for e in engines:  # untimed: the first calls of an engine allocate
        e.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))
    totals = {e.name: [0.0, 0] for e in engines}
    before = [e.stats() for e in engines]
    print(f"| prompt | {' | '.join(e.name + ' ms/token' for e in engines)} | B's speedup |")
    print("|---:|---:|---:|---:|")
    for i, prompt in enumerate(prompts):
        ms = {}
        for e in (engines if i % 2 == 0 else engines[::-1]):
            turn = e.generate([prompt], params)
            decode_seconds = turn.counters.hist.get("decode_time", (0.0, 0))[0]
            tokens = max(len(turn.token_ids[0]) - 1, 1)
            totals[e.name][0] += decode_seconds
            totals[e.name][1] += tokens
            ms[e.name] = 1000 * decode_seconds / tokens
        a, b = (ms[e.name] for e in engines)
        print(f"| {i} | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)
    a, b = (1000 * s / n for s, n in (totals[e.name] for e in engines))
    print(f"| all | {a:.1f} | {b:.1f} | **{a / b:.3f}** |")
    for e, start in zip(engines, before):
        stats = e.stats()
        if stats.get("num_proposals"):
            steps = stats["num_proposals"] - start["num_proposals"]
            draft = stats["draft_seconds"] - start["draft_seconds"]
            own = stats["propose_seconds"] - start["propose_seconds"] - draft
            print(f"\n{e.name}: {steps} steps; draft passes {1000 * draft / steps:.2f} ms a step, "
                  f"the proposer's own work {1000 * own / steps:.2f} ms a step; "
                  f"verified {json.dumps(stats['verified'])}; "
                  f"cost model {json.dumps(stats.get('cost_model'))}")
        e.shutdown()


if __name__ == "__main__":
    main()
