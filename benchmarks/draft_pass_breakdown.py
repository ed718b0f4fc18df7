"""Where a draft pass's time goes, at 1 request and at N, and how far it is from
the bytes it reads: the quantized (or the model's own) linear layers, the rest
of attention and MLP, the draft head, the attention metadata, the token choice;
then a plain decode step of the same engine (drafting paused), c = a pass over
that step, and c_limit = the weight bytes a pass reads over a plain step's
(benchlib/figures.py draft_weight_fraction): the c of a pass that costs only
its bytes. One in-process engine, fixed draft length, prompt lookup off; each
part is timed by wrapping the plugin's own functions (wall time, nested: "attn"
and "mlp" include their linears).

    .venv/bin/python benchmarks/draft_pass_breakdown.py --draft-weights int4 --k 8
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # proposer_stats sends a function
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the wrapped functions run here
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SPEC_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "spec_bench",
                          "question.jsonl")


def wrap_timers(totals: dict, counts: dict) -> None:
    from vllm_layerskip.core import draft_engine, draft_head, draft_layer, draft_weights

    def timed(owner, name, key, static=False):
        inner = getattr(owner, name)

        def timer(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[key] += time.perf_counter() - start
                counts[key] += 1

        setattr(owner, name, staticmethod(timer) if static else timer)

    timed(draft_engine.DraftEngine, "forward", "pass")
    timed(draft_engine, "build_attention_metadata", "metadata")
    timed(draft_layer.DraftLayer, "self_attn", "attn")
    timed(draft_layer.DraftLayer, "mlp", "mlp")
    timed(draft_weights.QuantizedLinear, "matmul", "quantized linears")
    timed(draft_head.DraftHead, "logits", "head")
    timed(draft_engine.DraftEngine, "_choose", "choose", static=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct"))
    ap.add_argument("--draft-weights", default="int4", help="int4, int8, w8a8 or none")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dataset-path", default=SPEC_BENCH)
    ap.add_argument("--compile", action="store_true", help="vLLM's compiled model (default: eager)")
    args = ap.parse_args()
    from benchlib.engines import IOMP_PATH, reexec_with_iomp

    if os.path.isfile(IOMP_PATH):
        reexec_with_iomp()  # as the other benchmarks: vLLM's CPU worker wants it

    from vllm import LLM, SamplingParams

    from benchlib.configs import model_config
    from benchlib.figures import draft_weight_fraction

    from vllm_layerskip.core.measure import proposer_stats, set_drafting_paused

    totals, counts = defaultdict(float), defaultdict(int)
    wrap_timers(totals, counts)
    # Every layer drafting: `quantized` through its draft weights, or (none)
    # `layer_skip` with nothing skipped, the model's own weights.
    spec = {"method": "layer_skip" if args.draft_weights == "none" else "quantized",
            "num_speculative_tokens": args.k, "adaptive_draft_length": False,
            "prompt_lookup_max": 0}
    if args.draft_weights != "none":
        spec["draft_weights"] = args.draft_weights
    llm = LLM(model=args.model, dtype="bfloat16", enforce_eager=not args.compile, max_model_len=2048,
              max_num_seqs=args.batch, speculative_config=spec)
    with open(args.dataset_path) as f:
        questions = [json.loads(line) for line in f][::10][: args.batch]
    chats = [[{"role": "user", "content": q["turns"][0]}] for q in questions]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    llm.chat(chats[:2], params, use_tqdm=False)  # first passes of each shape
    stats = proposer_stats(llm)
    scheme = args.draft_weights if args.draft_weights != "none" else None
    c_limit = draft_weight_fraction(model_config(args.model), 0, 0,
                                    stats.get("draft_vocab_size") or 0, scheme)
    print(f"{os.path.basename(args.model)}, draft_weights {args.draft_weights}, K = {args.k}, "
          f"{'compiled' if args.compile else 'eager'}, {args.max_tokens} tokens; ms per draft pass "
          "(nested: attn and mlp include their linears)")
    passes_ms = {}
    for batch in (1, args.batch):
        totals.clear()
        counts.clear()
        before = proposer_stats(llm)
        llm.chat(chats[:batch], params, use_tqdm=False)
        after = proposer_stats(llm)
        passes = after["num_forward_steps"] - before["num_forward_steps"]
        rows = (after["num_rows_run"] - before["num_rows_run"]) / max(passes, 1)
        parts = ", ".join(f"{key} {1000 * value / max(counts['pass'], 1):.1f}"
                          for key, value in totals.items() if key != "pass")
        passes_ms[batch] = 1000 * totals["pass"] / max(counts["pass"], 1)
        print(f"batch {batch}: {passes_ms[batch]:.1f} ms a pass ({rows:.1f} rows): {parts}")
    # A plain step of the same engine: drafting paused, the time per token after
    # the first (a 1-token request's time taken off).
    set_drafting_paused(llm, True)
    for batch in (1, args.batch):
        times = []
        for tokens in (1, args.max_tokens + 1):
            one = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
            start = time.perf_counter()
            llm.chat(chats[:batch], one, use_tqdm=False)
            times.append(time.perf_counter() - start)
        step_ms = 1000 * (times[1] - times[0]) / args.max_tokens
        print(f"batch {batch}: plain step {step_ms:.1f} ms; c = {passes_ms[batch] / step_ms:.3f} "
              f"(a draft pass / a plain step), c_limit = {c_limit:.3f} at batch 1 (weight bytes "
              f"a pass reads / a plain step's): c is {passes_ms[batch] / step_ms / c_limit:.2f}"
              " x c_limit")


if __name__ == "__main__":
    main()
