"""Benchmark plain decoding, vLLM's ngram, layer_skip and swift on Spec-Bench prompts.

Each configuration runs in its own LLM engine, greedy, over the chat-templated
first turns of Spec-Bench questions. Per configuration: output tokens/s, speedup
over plain, mean acceptance length M, acceptance rate alpha, the measured draft
cost coefficient c, the SWIFT Eq. 6 expected speedup and greedy parity with
plain. A markdown table goes to stdout and OUT/bench_<timestamp>.md, all raw
figures to OUT/bench_<timestamp>.json.

    python benchmarks/bench_methods.py --quick
    python benchmarks/bench_methods.py --methods plain layer_skip --ratios 0.35
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

IOMP_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         ".venv", "lib", "libiomp5.so")
METHODS = ("plain", "ngram", "layer_skip", "swift")


# ---- command line ------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--per-category", type=int, default=2, help="questions per category")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.35, 0.5])
    p.add_argument("--swift-ratio", type=float, default=0.45,
                   help="swift's skip ratio r; layer_skip with swift's initial (evenly "
                        "spread) set at the same r runs next to it")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--draft-length", nargs="+", choices=("adaptive", "fixed"),
                   default=["adaptive"],
                   help="layer_skip draft length: the plugin's cost-aware default, and/or "
                        "fixed K every step (adaptive_draft_length=false)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts per generate call (1: one request at a time)")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--quick", action="store_true", help="1 question per category, 64 tokens")
    p.add_argument("--preload-iomp", action=argparse.BooleanOptionalAction,
                   default=os.path.isfile(IOMP_PATH),
                   help=f"re-exec with LD_PRELOAD={IOMP_PATH} (default: on if it exists)")
    args = p.parse_args(argv)
    if args.quick:
        args.per_category, args.max_tokens = 1, 64
    return args


def maybe_reexec_with_iomp(args) -> None:
    """vLLM's CPU worker is faster for spec decoding with Intel OpenMP preloaded;
    LD_PRELOAD only takes effect at process start, so re-exec ourselves."""
    preload = os.environ.get("LD_PRELOAD", "")
    if not args.preload_iomp or "libiomp" in preload:
        return
    env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [IOMP_PATH, preload])))
    print(f"re-exec with LD_PRELOAD={env['LD_PRELOAD']}", flush=True)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


# ---- configurations ----------------------------------------------------------------

def build_configs(args) -> list[tuple[str, dict | None]]:
    k = args.k
    configs = []
    if "plain" in args.methods:
        configs.append(("plain", None))
    if "ngram" in args.methods:
        configs.append(("ngram", {"method": "ngram", "num_speculative_tokens": k,
                                  "prompt_lookup_max": 4, "prompt_lookup_min": 2}))
    for mode in args.draft_length if "layer_skip" in args.methods else []:
        extra, suffix = ({}, "") if mode == "adaptive" else (
            {"adaptive_draft_length": False}, ", fixed K")
        base = {"method": "layer_skip", "num_speculative_tokens": k, **extra}
        configs.append((f"layer_skip r=0 (no skip){suffix}", base))
        for r in args.ratios:
            configs.append((f"layer_skip r={r:g}{suffix}", {**base, "skip_ratio": r}))
    for mode in args.draft_length if "swift" in args.methods else []:
        extra, suffix = ({}, "") if mode == "adaptive" else (
            {"adaptive_draft_length": False}, ", fixed K")
        r = args.swift_ratio
        configs.append((f"layer_skip swift's initial set r={r:g}{suffix}",
                        {"method": "layer_skip", "num_speculative_tokens": k, **extra,
                         **swift_initial_set(args.model_path, r)}))
        configs.append((f"swift r={r:g}{suffix}", {"method": "swift", "num_speculative_tokens": k,
                                                   "skip_ratio": r, **extra}))
    return configs


def swift_initial_set(model: str, ratio: float) -> dict:
    """The evenly spread set SWIFT starts from, as layer_skip options."""
    from vllm_layerskip.options import SwiftOptions
    from vllm_layerskip.skip_search import SubLayerSpace

    with open(os.path.join(model, "config.json")) as f:
        num_layers = json.load(f)["num_hidden_layers"]
    space = SubLayerSpace(num_layers)
    return space.layer_sets(space.evenly_spread(SwiftOptions(skip_ratio=ratio).num_skipped(num_layers)))


def make_llm(args, model: str, spec: dict | None):
    from vllm import LLM

    return LLM(model=model, speculative_config=spec, dtype=args.dtype, enforce_eager=True,
               max_model_len=2048, disable_log_stats=False, seed=0)


# ---- one configuration -------------------------------------------------------------

def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_config(args, model: str, name: str, spec: dict | None, questions: list[dict]) -> dict:
    from tqdm import tqdm
    from vllm import SamplingParams

    from vllm_layerskip import measure

    t0 = time.perf_counter()
    llm = make_llm(args, model, spec)
    startup_s = time.perf_counter() - t0
    try:
        prompts = measure.chat_prompts(llm, [q["prompt"] for q in questions])
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        stats_before = measure.proposer_stats(llm)
        counters_before = measure.spec_decode_counters(llm)
        token_ids, seconds, steps = [], 0.0, 0
        for batch in tqdm(chunks(prompts, args.batch_size), desc=name, leave=False):
            res = measure.timed_generate(llm, batch, params)
            token_ids += res.token_ids
            seconds += res.seconds
            steps += max(len(t) for t in res.token_ids)  # engine decode steps of the call
        counters = measure.spec_decode_counters(llm) - counters_before
        stats = diff_stats(measure.proposer_stats(llm), stats_before)
    finally:
        measure.shutdown(llm)
    num_tokens = sum(len(t) for t in token_ids)
    return {
        "name": name, "speculative_config": spec, "startup_seconds": startup_s,
        "seconds": seconds, "num_tokens": num_tokens, "tokens_per_second": num_tokens / seconds,
        "seconds_per_step": seconds / steps, "token_ids": token_ids,
        "counters": {"drafts": counters.drafts, "draft_tokens": counters.draft_tokens,
                     "accepted_tokens": counters.accepted_tokens,
                     "accepted_per_pos": list(counters.accepted_per_pos)},
        "M": counters.mean_acceptance_length if counters.drafts else None,
        "alpha": counters.acceptance_rate if counters.drafts else None,
        "proposer_stats": stats,
    }


def diff_stats(after: dict, before: dict) -> dict:
    """Counters of the timed part: numbers are differenced, anything else (the
    cost model's summary) is kept as it was at the end, plus its drafting fraction
    over the timed part."""
    out = {k: v - before.get(k, 0) if isinstance(v, (int, float)) else v
           for k, v in after.items()}
    cm_after, cm_before = after.get("cost_model"), before.get("cost_model") or {}
    if cm_after and cm_after["steps"] > cm_before.get("steps", 0):
        drafting = lambda cm: cm.get("drafting_fraction", 0.0) * cm.get("steps", 0)
        out["drafting_fraction"] = ((drafting(cm_after) - drafting(cm_before))
                                    / (cm_after["steps"] - cm_before.get("steps", 0)))
    return out


# ---- derived figures ---------------------------------------------------------------

def swift_expected_speedup(m: float, alpha: float, c: float) -> float | None:
    """SWIFT Eq. 6: E = M / ((M-1) * c / alpha + 1) = M*alpha / ((M-1)*c + alpha).

    M: tokens per target forward; (M-1)/alpha: draft forward steps per target
    forward (alpha = accepted / drafted); c: draft step time / target step time.
    Assumes a verify forward costs as much as one plain decode step."""
    if alpha <= 0:
        return None
    return m * alpha / ((m - 1) * c + alpha)


def add_derived(results: list[dict], dtype: str) -> None:
    plain = next((r for r in results if r["speculative_config"] is None), None)
    for r in results:
        r["speedup"] = r["tokens_per_second"] / plain["tokens_per_second"] if plain else None
        r["parity"] = parity(r, plain)
        r["c"] = r["v"] = r["expected_speedup"] = None
        st = r["proposer_stats"]
        if st.get("swift"):
            # Share of the timed wall clock spent scoring candidates on the
            # engine thread (the optimizer thread runs beside it).
            r["optimizer_share"] = st["swift"]["score_seconds"] / r["seconds"]
        if plain and st.get("num_forward_steps"):
            r["draft_seconds_per_step"] = st["draft_seconds"] / st["num_forward_steps"]
            r["c"] = r["draft_seconds_per_step"] / plain["seconds_per_step"]
            # Everything but drafting (verify forward, sampling, scheduling) per engine
            # step (one proposal per step), relative to a plain step; Eq. 6 assumes 1.
            r["v"] = ((r["seconds"] - st["draft_seconds"]) / st["num_proposals"]
                      / plain["seconds_per_step"])
            if r["M"] is not None:
                r["expected_speedup"] = swift_expected_speedup(r["M"], r["alpha"], r["c"])
    if dtype != "float32":
        for r in results:
            r["parity_note"] = "parity is only exact-by-construction in float32"


def parity(r: dict, plain: dict | None) -> dict | None:
    """Greedy tokens equal plain's? With the first differing prompt and position."""
    if plain is None or r is plain:
        return None
    for i, (a, b) in enumerate(zip(r["token_ids"], plain["token_ids"])):
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return {"equal": False, "prompt": i, "position": pos,
                    "got": a[pos:pos + 8], "plain": b[pos:pos + 8]}
    return {"equal": True}


# ---- report ------------------------------------------------------------------------

def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown_table(results: list[dict]) -> str:
    rows = ["| config | tok/s | speedup | M | alpha | c | v | E (Eq. 6) | drafting | optimizer | parity |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in results:
        par = "-" if r["parity"] is None else ("yes" if r["parity"]["equal"] else "**NO**")
        drafting = r["proposer_stats"].get("drafting_fraction")
        rows.append(f"| {r['name']} | {r['tokens_per_second']:.1f} | {fmt(r['speedup'])} | "
                    f"{fmt(r['M'])} | {fmt(r['alpha'])} | {fmt(r['c'], '.3f')} | {fmt(r['v'])} | "
                    f"{fmt(r['expected_speedup'])} | {fmt(drafting, '.0%')} | "
                    f"{fmt(r.get('optimizer_share'), '.0%')} | {par} |")
    return "\n".join(rows)


def swift_notes(results: list[dict]) -> str:
    """What each swift run learned."""
    notes = []
    for r in results:
        sw = r["proposer_stats"].get("swift")
        if not sw:
            continue
        reason = f" ({sw['stop_reason']})" if sw["stop_reason"] else ""
        notes.append(
            f"- {r['name']}: phase {sw['phase']}{reason}, "
            f"{sw['optimization_steps']} optimization steps, matchness {fmt(sw['initial_matchness'])} "
            f"(initial set) -> {fmt(sw['best_matchness'])} (best), r={sw['skip_ratio']:g}, "
            f"scoring {sw['score_seconds']:.1f} s on the engine thread, optimizer thread "
            f"{sw['worker_seconds']:.1f} s; learned set {sw['best_set']}")
    return "\n".join(notes)


def machine_info(args, model: str) -> dict:
    import torch
    import vllm

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]), "platform": platform.platform(),
        "cpu": cpu, "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "vllm": vllm.__version__, "model": model,
        "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "args": vars(args),
    }


def header(args, info: dict, n_prompts: int) -> str:
    iomp = "libiomp" in info["LD_PRELOAD"]
    return (f"{os.path.basename(info['model'])}, {info['date']}: {n_prompts} Spec-Bench prompts, "
            f"max_tokens={args.max_tokens}, K={args.k}, batch={args.batch_size}, "
            f"dtype={args.dtype}, libiomp preloaded={iomp}, {info['cpu']} x{info['cpu_count']}, "
            f"vllm {info['vllm']}, torch {info['torch']}")


def save(args, info: dict, results: list[dict], text: str) -> str:
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(args.out, f"bench_{stamp}")
    with open(base + ".md", "w") as f:
        f.write(text + "\n")
    with open(base + ".json", "w") as f:
        json.dump({"machine": info, "results": results}, f, indent=1)
    return base


def main() -> None:
    args = parse_args()
    maybe_reexec_with_iomp(args)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # for proposer_stats

    from vllm_layerskip.default_model import ensure_default_model
    from vllm_layerskip.measure import load_spec_bench

    model = args.model or ensure_default_model()
    args.model_path = model
    questions = load_spec_bench(args.per_category)
    info = machine_info(args, model)
    results = []
    configs = build_configs(args)
    for i, (name, spec) in enumerate(configs, 1):
        print(f"[{i}/{len(configs)}] {name} ...", flush=True)
        r = run_config(args, model, name, spec, questions)
        print(f"[{i}/{len(configs)}] {name}: {r['tokens_per_second']:.1f} tok/s "
              f"({r['num_tokens']} tokens in {r['seconds']:.1f} s, "
              f"engine start {r['startup_seconds']:.0f} s)", flush=True)
        results.append(r)
    add_derived(results, args.dtype)
    text = header(args, info, len(questions)) + "\n\n" + markdown_table(results)
    if swift_notes(results):
        text += "\n\n" + swift_notes(results)
    bad = [r for r in results if r["parity"] and not r["parity"]["equal"]]
    for r in bad:
        text += f"\n\nPARITY FAILURE {r['name']}: {r['parity']}"
    print("\n" + text)
    print(f"\nsaved {save(args, info, results, text)}.md/.json")


if __name__ == "__main__":
    main()
