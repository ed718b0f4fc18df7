"""Compare plain decoding, vLLM's own speculative methods and the plugin's methods
on Spec-Bench prompts, on one model, in one session.

One engine per configuration, all started once and kept alive; the
configurations take turns on the same prompts (per category in batch-1 mode, per
batch in concurrent mode), in an order that rotates, so machine drift cancels out
of the speedups. Workloads: batch 1 (per category) and N concurrent requests
(aggregate), each greedy and at temperature 1. Per configuration and category:
tokens/s, speedup over plain, M, alpha, c, SWIFT's Eq. 6, the optimizer's time
share, peak memory and greedy parity; plus a projection for memory-bound
hardware. Writes OUT/bench_<timestamp>.md/.csv/.json/_speedup.png/_acceptance.png.

    python benchmarks/bench_methods.py --quick
    python benchmarks/bench_methods.py --methods plain ngram layer_skip --ratios 0.35
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.configs import (DEFAULT_METHODS, METHODS, build_configs, engine_groups,  # noqa: E402
                              lookup_bounds, model_config, parse_method_k, sequential_groups)
from benchlib.engines import IOMP_PATH, reexec_with_iomp  # noqa: E402
from benchlib.workloads import (Workload, categories_in_order, concurrent_blocks,  # noqa: E402
                                latency_blocks, load_questions, schedule, sustained_blocks,
                                warmup_questions)
from vllm_layerskip.core.draft_weights import SCHEMES as DRAFT_WEIGHT_SCHEMES  # noqa: E402

# Memory one engine takes besides its KV cache (EngineCore ~0.8 GiB, Worker
# ~1.5 GiB, ngram's numba JIT 0.3 GiB more; SmolLM2 in float32), to decide how many fit at once.
ENGINE_GIB_BESIDES_KV = 2.6
MEMORY_RESERVE_GIB = 2.0  # left for others sharing the machine


# ---- command line ------------------------------------------------------------------

def lookup_setting(text: str) -> str:
    """--prompt-lookup's values: default, on, off, suffix_tree or MAX..MIN."""
    if text not in ("default", "on", "off", "suffix_tree"):
        try:
            lookup_bounds(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="a checkpoint directory, or a name `vllm-layerskip prepare-model` "
                        "knows (qwen2.5-coder-1.5b, ...); default: SmolLM2-135M-Instruct; 'identity-padded': SmolLM2 with an "
                        "identity layer after each layer, layer_skip skipping those "
                        "(benchlib/padded_model.py: a draft that beats plain decoding here)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS),
                   help="plain always runs. Methods that cannot run here (dependency missing, "
                        "not in this plugin version, GPU-only) are listed as skipped, with why")
    p.add_argument("--draft-model", default=None, metavar="DIR",
                   help="the draft of --methods draft_model (default: Qwen2.5-Coder-0.5B-Instruct "
                        "as `vllm-layerskip prepare-model qwen2.5-coder-0.5b` caches it; it "
                        "drafts for Qwen2.5-Coder-1.5B: same vocabulary); its K is --k")
    p.add_argument("--dataset-path", default=None,
                   help="Spec-Bench's question.jsonl (default: $SPEC_BENCH_QUESTIONS, or beside the "
                        "checkout; without either, the project's own prompts, with a notice)")
    p.add_argument("--per-category", type=int, default=1, help="questions per category (batch 1)")
    p.add_argument("--categories", nargs="+", default=None, help="default: all 13")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                   help="1: batch-1 latency mode, per category; N: N requests at once")
    p.add_argument("--rounds", type=int, default=1,
                   help="batches of N distinct questions per concurrency N")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--workloads", nargs="+", default=None, metavar="N:T",
                   help="explicit (concurrency, temperature) pairs, e.g. 1:0 8:1; Ns:T keeps N "
                        "requests in flight (as vllm bench serve --max-concurrency N) over "
                        "blocks of 3N questions; default: every --concurrency with every "
                        "--temperatures")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.45],
                   help="layer_skip skip ratios (uniform spread; 0: nothing skipped)")
    p.add_argument("--layer-skip-sets", type=json.loads, nargs="+", default=None, metavar="JSON",
                   help='layer_skip rows with explicit sets instead of --ratios, e.g. '
                        '\'{"skip_mlp": [3, 6, 9, 12, 15, 18, 21, 24]}\'')
    p.add_argument("--swift-ratio", type=float, default=None,
                   help="SWIFT's skip ratio r (default: the plugin's)")
    p.add_argument("--clasp-ratio", type=float, default=None,
                   help="CLaSp's skip ratio (default: the plugin's)")
    p.add_argument("--method-options", type=json.loads, default={},
                   help='extra speculative-config keys per method, JSON, e.g. '
                        '\'{"clasp": {"layer_optimization_interval": 8}}\'')
    p.add_argument("--method-k", nargs="+", default=[], metavar="METHOD=K[,K...]",
                   help="one row per K for that method (its own K instead of --k), e.g. "
                        "draft_model=2,3,4 ngram=4,8: a peer's best K in the same run")
    p.add_argument("--draft-length", nargs="+", choices=("adaptive", "fixed"),
                   default=["adaptive"],
                   help="plugin methods: the cost-aware draft length (plugin default) and/or "
                        "K every step (adaptive_draft_length=false); both: one row each")
    p.add_argument("--draft-vocab-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="each plugin method once per pruned draft vocabulary size "
                        "(draft_vocab_size; 0: the full vocabulary); default: the plugin's default")
    p.add_argument("--prompt-lookup", nargs="+", type=lookup_setting, default=None,
                   metavar="{default,on,off,suffix_tree,MAX..MIN}",
                   help="each plugin method with prompt lookup on (prompt_lookup_max 4, _min 2), "
                        "off, MAX..MIN (e.g. 4..4: only matches of 4 tokens), suffix_tree (copies "
                        "from suffix trees: copy_source suffix_tree), and/or as the plugin's default")
    p.add_argument("--draft-weights", nargs="+", choices=("default", *DRAFT_WEIGHT_SCHEMES), default=None,
                   help="each plugin method once per draft_weights setting (quantized copies of "
                        "the linear weights that draft passes read; default: the plugin's)")
    p.add_argument("--draft-weights-grid", nargs="+", choices=("auto", "minmax"), default=None,
                   help="each plugin method with int4 draft weights once per draft_weights_grid "
                        "(\"auto\": a 4-bit checkpoint's own grid where its groups show one; "
                        "\"minmax\": the grid a checkpoint never quantized gets)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--compile", action="store_true",
                   help="vLLM's default model compilation (torch.compile, inductor on CPU), "
                        "as `vllm serve` runs without --enforce-eager; default: eager, as the "
                        "tests run (engines start in ~20 s instead of 1-3 min). The plugin's "
                        "draft passes run eagerly either way (core/model_adapter.py)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="batch-1 mode: prompts of a category per generate call")
    p.add_argument("--kv-cache-gib", type=int, default=1,
                   help="VLLM_CPU_KVCACHE_SPACE per engine, unless set in the environment")
    p.add_argument("--max-engines", type=int, default=0,
                   help="engines alive at once (0: as many as free memory holds). With more "
                        "configurations, they run in groups, each with its own plain engine")
    p.add_argument("--sequential", action="store_true",
                   help="one engine alive at a time, each configuration after plain on the same "
                        "prompts (not interleaved): for engines two of which do not fit in "
                        "memory (the 1.5B model in float32 here, ~11.5 GiB each). Machine drift "
                        "then enters the speedups; plain_control measures how much")
    p.add_argument("--settle", type=float, default=0.25,
                   help="seconds after each turn before the next engine runs")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--quick", action="store_true",
                   help="1 question per category, 32 tokens, workloads 1:0 8:0 8:1, 1 round")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logs")
    p.add_argument("--preload-iomp", action=argparse.BooleanOptionalAction,
                   default=os.path.isfile(IOMP_PATH),
                   help=f"re-exec with LD_PRELOAD={IOMP_PATH} (default: on if it exists)")
    args = p.parse_args(argv)
    try:
        args.method_k = dict(parse_method_k(text) for text in args.method_k)
    except ValueError as e:
        p.error(str(e))
    if args.quick:
        given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        if "--per-category" not in given:
            args.per_category = 1
        if "--max-tokens" not in given:
            args.max_tokens = 32
        if not given & {"--concurrency", "--temperatures", "--workloads"}:
            # Batch 1 per category is the slow part; greedy only (T=1 runs concurrent).
            args.workloads = ["1:0", "8:0", "8:1"]
        if "--rounds" not in given:
            args.rounds = 1
    return args


def maybe_reexec_with_iomp(args) -> None:
    """vLLM's CPU worker is faster for spec decoding with Intel OpenMP preloaded."""
    if args.preload_iomp:
        reexec_with_iomp()


# ---- engines -----------------------------------------------------------------------

def start_engines(group, g: int, args, model: str, failed: dict, started: list, log) -> list:
    from benchlib.engines import Engine
    from benchlib.figures import plain_name

    llm_kwargs = dict(dtype=args.dtype, enforce_eager=not args.compile, max_model_len=2048, seed=0)
    engines = []
    for config in group:
        if config.family in ("plain", "control") and g:
            config = type(config)(**{**asdict(config), "name": plain_name(g, config.name)})
        engine = Engine(config, model, llm_kwargs)
        log(f"starting engine {config.name} ...")
        try:
            engine.start()
        except Exception as e:  # noqa: BLE001 - reported, the others still run
            if config.family == "plain":
                raise
            failed[config.name] = f"engine start failed: {str(e).splitlines()[0][:300]}"
            log(f"{config.name}: {failed[config.name]}")
            continue
        log(f"{config.name}: started in {engine.startup_seconds:.0f} s, "
            f"{engine.memory()['rss_mib'] / 1024:.1f} GiB")
        engines.append(engine)
        started.append(engine.config)
    return engines


# ---- the run -----------------------------------------------------------------------

# Full-length, one-request generations that warm each engine before its first timed turn.
WARMUP_TURNS = 4


def run_group(engines, g: int, workloads, prompts, warmup, args, turns, failed, bar) -> None:
    from vllm import SamplingParams

    by_name = {e.name: e for e in engines}
    names = list(by_name)
    warmed = set()
    for workload, b, block, name in schedule(workloads, names):
        engine = by_name.get(name)
        bar.set_description(f"{workload.label} | {block.category} | {name}")
        if engine is None or name in failed:
            bar.update(1)
            continue
        texts = [prompts[i] for i in block.questions]
        try:
            if (workload, name) not in warmed:
                # Untimed, on questions outside the timed set: an engine's first calls
                # at a new batch size or temperature allocate. Its first ones run at
                # full length, one request at a time: the first long generations ran
                # slow for any engine (plain's A/A control at 0.81x on the first
                # question of a run, 2026-11-24, which 8 tokens did not absorb; with
                # one full-length warm-up, 5 of a run's 10 turns below 0.9x plain
                # were among its first 20 of 552, 2026-11-24 11:12).
                if not any(n == name for _, n in warmed):
                    for i in warmup[:WARMUP_TURNS]:
                        engine.generate([prompts[i]], SamplingParams(
                            temperature=workload.temperature, max_tokens=args.max_tokens))
                engine.generate([prompts[i] for i in warmup[:workload.concurrency]],
                                SamplingParams(temperature=workload.temperature, max_tokens=8))
                warmed.add((workload, name))
            params = SamplingParams(temperature=workload.temperature, max_tokens=args.max_tokens)
            if workload.sustained:
                turn = engine.generate_in_flight(texts, params, workload.concurrency,
                                                 settle=args.settle)
            else:
                turn = engine.generate(texts, params, settle=args.settle,
                                       batch_size=args.batch_size if workload.latency else None)
        except Exception as e:  # noqa: BLE001 - an engine that dies must not end the run
            failed[name] = f"failed during {workload.label}: {str(e).splitlines()[0][:300]}"
            bar.write(f"{name}: {failed[name]}")
            bar.update(1)
            continue
        turns.append({
            "group": g, "workload": workload.label, "concurrency": workload.concurrency,
            "temperature": workload.temperature, "block": b, "category": block.category,
            "config": name, "family": engine.config.family, "questions": block.questions,
            "seconds": turn.seconds, "num_tokens": sum(len(t) for t in turn.token_ids),
            "num_requests": len(texts), "steps": turn.steps, "token_ids": turn.token_ids,
            "counters": asdict(turn.counters), "stats": turn.stats,
        })
        bar.set_postfix_str(f"{turns[-1]['num_tokens'] / turn.seconds:.1f} tok/s")
        bar.update(1)


def main() -> None:
    args = parse_args()
    maybe_reexec_with_iomp(args)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # proposer_stats sends a function
    # vLLM's ngram proposer runs its lookup as a numba parallel loop. numba's default
    # OpenMP layer leaves its threads spinning after each loop, on the cores the
    # worker's OpenMP threads need: on the 2-core AVX2 CPU, Qwen2.5-Coder-1.5B float32,
    # ngram decoded at 0.96-1.18 s a token against plain's 0.64, at 0.68-0.70 with the
    # workqueue layer (2026-11-27). The comparison is against ngram at its best.
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    from vllm_layerskip.tools.cpu_threads import bind_every_core
    bind_every_core()  # vLLM keeps a core back for its engine process: half of 2 cores
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up warnings are noise here

    from tqdm import tqdm

    from benchlib import figures, padded_model, report
    from benchlib.engines import engines_that_fit
    from vllm_layerskip.tools.prepare_model import CATALOG, ensure_default_model, ensure_model
    from vllm_layerskip.tools.prompts import benchmark_dataset

    model = args.model or ensure_default_model()
    if model in CATALOG:  # a name `vllm-layerskip prepare-model` knows
        model = ensure_model(model, quiet=True)
    if model == padded_model.NAME:
        base = ensure_default_model()
        model = padded_model.ensure_padded_model(base)
        args.identity_layers = padded_model.identity_layers(model_config(base)["num_hidden_layers"])
    args.model_path = model
    configs = build_configs(args, model)
    runnable = [c for c in configs if c.runs]
    skipped = [c for c in configs if not c.runs]
    for c in skipped:
        print(f"skipped {c.name}: {c.skip_reason}", flush=True)

    args.dataset_path = benchmark_dataset(args.dataset_path)
    questions = load_questions(args.dataset_path)
    cats = args.categories or categories_in_order(questions)
    try:
        wanted = ([Workload.parse(w) for w in args.workloads] if args.workloads else
                  [Workload(n, t) for n in args.concurrency for t in args.temperatures])
    except ValueError as e:
        sys.exit(f"--workloads: {e}")
    workloads = []
    for w in wanted:
        n = w.concurrency
        blocks = (latency_blocks(questions, args.per_category, cats, args.batch_size) if w.latency
                  else sustained_blocks(questions, n, args.rounds, cats) if w.sustained
                  else concurrent_blocks(questions, n, args.rounds, cats))
        workloads.append((w, blocks))

    per_engine = ENGINE_GIB_BESIDES_KV + float(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    max_engines = args.max_engines or engines_that_fit(MEMORY_RESERVE_GIB, per_engine)
    if args.sequential:
        groups = sequential_groups(runnable)  # turns paired with group 0's plain (below)
    elif max_engines < 2:
        sys.exit(f"free memory holds {max_engines} engine(s) of ~{per_engine:.1f} GiB; at least "
                 "2 are needed (plain and one method). Free memory, lower --kv-cache-gib, or "
                 "give --sequential (one engine at a time, not interleaved).")
    else:
        groups = engine_groups(runnable, max_engines)
    info = report.machine_info(args, model)
    alive = "one engine alive at a time" if args.sequential else f"at most {max_engines}"
    print(f"{len(runnable)} configurations in {len(groups)} group(s) of engines alive at once "
          f"({alive}); workloads: {', '.join(w.label for w, _ in workloads)}", flush=True)

    turns, failed, engines_info, final_stats, prompts, started = [], {}, {}, {}, {}, []
    warmup: list[int] = []
    total = sum(len(blocks) * len(group) for group in groups for _, blocks in workloads)
    bar = None  # made once the first engines are up, so its rate and ETA are the turns'
    for g, group in enumerate(groups):
        g = 0 if args.sequential else g  # the group whose plain engine a turn is paired with
        engines = start_engines(group, g, args, model, failed, started,
                                bar.write if bar else lambda m: print(m, flush=True))
        if bar is None:
            bar = tqdm(total=total, unit="turn", dynamic_ncols=True)
        try:
            if not prompts:
                from vllm_layerskip.core.measure import chat_prompts

                timed = {i for _, blocks in workloads for b in blocks for i in b.questions}
                warmup = warmup_questions(
                    questions, timed, max(WARMUP_TURNS, *(w.concurrency for w, _ in workloads)))
                used = sorted(timed | set(warmup))
                texts = chat_prompts(engines[0].llm, [questions[i]["prompt"] for i in used])
                prompts = dict(zip(used, texts))
            run_group(engines, g, workloads, prompts, warmup, args, turns, failed, bar)
        finally:
            for e in engines:
                engines_info[(g, e.name)] = {"startup_seconds": e.startup_seconds,
                                             "memory": e.memory(), "spec": e.config.spec}
                try:
                    final_stats[e.name] = e.stats()
                except Exception:  # noqa: BLE001 - a dead engine has no stats
                    final_stats[e.name] = {}
                e.shutdown()
    bar.close()

    figures.check_parity(turns)
    rows = figures.derive(figures.aggregate(turns), engines_info, figures.speedup_intervals(turns))
    # Table order: the plain engine(s) first, then the configurations in order.
    started.sort(key=lambda c: c.family != "plain")  # stable: groups keep their order
    names = [c.name for c in started]
    model_cfg = model_config(model)
    proj = figures.projection(rows, {c.name: c for c in started}, final_stats, model_cfg)
    # The bytes a one-row draft pass reads: c's floor at batch 1 (a pass of more
    # rows than the int4 kernel serves reads the model's own weights).
    limits = {p["config"]: p["c_w"] for p in proj}
    for r in rows:
        one_row = r.get("c") is not None and "batch 1" in r["workload"]
        r["c_limit"] = limits.get(r["config"]) if one_row else None
    text = report.markdown(args, info, workloads, started, rows, skipped, failed, final_stats,
                           proj, cats, len(started), len(groups))
    print("\n" + text)

    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "bench_" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    with open(base + ".md", "w") as f:
        f.write(text + "\n")
    report.write_csv(base + ".csv", rows, info)
    report.write_json(base + ".json", {
        "machine": info,
        "configs": [asdict(c) for c in configs],
        "failed": failed,
        "engines": {f"{name} (group {g + 1})": v for (g, name), v in engines_info.items()},
        "final_proposer_stats": final_stats,
        "rows": rows, "projection": proj, "turns": turns,
    })
    files = report.plots(base, rows, workloads, names, cats, info, args.k) if args.plots else []
    print(f"\nsaved {base}.md/.csv/.json" + "".join(f", {os.path.basename(p)}" for p in files))


if __name__ == "__main__":
    main()
