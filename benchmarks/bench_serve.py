"""The same comparison through vLLM's own tooling: one `vllm serve` per
configuration, measured with `vllm bench serve`, over a sweep of concurrency
levels (and, with --prompt-tokens, of prompt lengths).

The servers of a group start first (each on its own loopback port; as many as
free memory holds, ~4.6 GiB each, plain first in every group) and stay up. Each
round runs every cell of the sweep (each --max-concurrency level, for each
--prompt-tokens length) against every server of the group, the servers of a
cell in a balanced order (a Williams Latin square row per round and cell, as in
bench_methods.py, at the granularity vLLM's client allows); levels go up in even
rounds and down in odd ones. Each server is a process group of its own, stopped
when its group is done with SIGTERM (SIGKILL after 30 s).

Prompts: Spec-Bench first turns by default, a new sample per round and level
(seed 1000*round + the level's index), written as jsonl for `--dataset-name
custom` (vLLM's own spec_bench dataset ignores --seed: spec_bench_files). With --prompt-tokens N
[N ...], the project's own long prompts instead, built at about N tokens each
(the model's tokenizer, before the chat template; benchlib/long_prompts.py):
source files of vllm_layerskip/ to edit, and docs/*.md to answer a question
from, half each, written as jsonl for `--dataset-name custom` into the run's
folder; every prompt opens with a line of its own (round, level, index), so no
request is served from vLLM's prefix cache of another. At concurrency c a cell
sends max(--num-prompts, --prompts-per-level * c) prompts.

Report per (config, prompt length, level): output tok/s, speedup over the plain
server of the same group (ratio of tokens/s summed over rounds) with an interval
over rounds (2-3 rounds: the lowest and highest per-round ratio; 4 or more: a 95%
bootstrap over rounds), TPOT p50, TTFT p50 and p99 (medians over rounds of
vLLM's per-round figures), TTFT p50 over plain's, vLLM's acceptance length and
rate, the A/A control (--methods plain_control) as a row, and per configuration
the first level where its speedup falls below 0.97. Writes
OUT/serve_<timestamp>.md/.json/.png (the PNG: speedup against concurrency) plus
every server log, vLLM's result files and the prompt files under
OUT/serve_<timestamp>/.

    python benchmarks/bench_serve.py --quick
    python benchmarks/bench_serve.py --model qwen2.5-coder-1.5b --dtype bfloat16 \\
        --methods plain plain_control quantized ngram --max-concurrency 1 2 4 8 16 32 --rounds 2
    python benchmarks/bench_serve.py --model qwen2.5-coder-1.5b --dtype bfloat16 \\
        --methods plain ngram swift --max-concurrency 1 4 16 --prompts-per-level 4 \\
        --prompt-tokens 256 1024 3072 --output-len 128 --rounds 4
    python benchmarks/bench_serve.py --from-json benchmarks/results/serve_20260101-120000.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.configs import DEFAULT_METHODS, METHODS, build_configs, engine_groups  # noqa: E402
from benchlib.figures import plain_name  # noqa: E402
from benchlib.engines import engines_that_fit, model_path, with_iomp_preloaded  # noqa: E402
from benchlib.workloads import williams_orders  # noqa: E402

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")
# Memory of one `vllm serve` besides its KV cache: API server ~1 GiB, EngineCore
# ~0.8 GiB, Worker ~1.5 GiB (SmolLM2, float32).
SERVER_GIB = 3.6
# Below this speedup over plain, speculation no longer pays at that level.
PAYS = 0.97
BOOTSTRAP_ROUNDS = 4  # from this many rounds on, the interval is a bootstrap
BOOTSTRAP_REPS = 4000


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="a checkpoint directory or hub id, or a name `vllm-layerskip prepare-model` "
                        "knows (smollm2-135m, qwen2.5-coder-1.5b, ...; prepared if needed); "
                        "default: SmolLM2-135M-Instruct")
    p.add_argument("--dataset-path", default=None,
                   help="Spec-Bench's question.jsonl (default: $SPEC_BENCH_QUESTIONS, or beside the "
                        "checkout; without either, the project's own prompts, with a notice)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.45])
    p.add_argument("--swift-ratio", type=float, default=None)
    p.add_argument("--clasp-ratio", type=float, default=None)
    p.add_argument("--method-options", type=json.loads, default={})
    p.add_argument("--draft-length", nargs="+", choices=("adaptive", "fixed", "paused"),
                   default=["adaptive"],
                   help="adaptive: the cost model picks each step's draft length (the default); "
                        "fixed: K every step; paused: the method's server with drafting paused "
                        "from the start (the plugin loaded, nothing drafted): what a served "
                        "method pays beside its drafts; several: one row each")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-prompts", type=int, default=26, help="prompts per server and cell")
    p.add_argument("--prompts-per-level", type=int, default=0, metavar="F",
                   help="at concurrency c, send max(--num-prompts, F*c) prompts (0: --num-prompts "
                        "at every level)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-concurrency", type=int, nargs="+", default=[1],
                   help="concurrency levels swept, e.g. 1 2 4 8 16 32")
    p.add_argument("--prompt-tokens", type=int, nargs="+", default=None, metavar="N",
                   help="instead of Spec-Bench, the project's long prompts of about N tokens "
                        "(code to edit, documents to answer from), each length swept")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--category", default=None, help="one Spec-Bench category (default: all)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--port", type=int, default=8310, help="first port; one per server")
    p.add_argument("--max-servers", type=int, default=0,
                   help="servers up at once (0: as many as free memory holds); more "
                        "configurations run in groups, each with its own plain server")
    p.add_argument("--kv-cache-gib", type=int, default=1)
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--quick", action="store_true", help="8 prompts x 32 tokens")
    p.add_argument("--from-json", default=None, metavar="FILE",
                   help="no servers: render the table and the plot again from a run's .json")
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        if "--num-prompts" not in given:
            args.num_prompts = 8
        if "--output-len" not in given:
            args.output_len = 32
    if min(args.max_concurrency) < 1 or args.rounds < 1 or args.num_prompts < 1:
        p.error("--max-concurrency levels, --rounds and --num-prompts must be at least 1")
    if args.prompt_tokens and min(args.prompt_tokens) < 64:
        p.error("--prompt-tokens: at least 64 tokens (the instruction alone is ~20)")
    return args


def levels_of(args) -> list[int]:
    return sorted(set(args["max_concurrency"] if isinstance(args, dict) else args.max_concurrency))


def prompts_at(args, level: int) -> int:
    """Prompts a cell at concurrency `level` sends to each server."""
    return max(args.num_prompts, args.prompts_per_level * level)


def max_model_len(args) -> int:
    """2048, or what the longest --prompt-tokens prompt needs (its chat template
    and first line, ~64 tokens, and --output-len), in steps of 256."""
    need = max(args.prompt_tokens or [0]) + 64 + args.output_len
    return max(2048, -(-need // 256) * 256)


def server_command(args, model: str, port: int, spec: dict | None) -> list[str]:
    cmd = [VLLM, "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", args.dtype, "--enforce-eager", "--max-model-len", str(max_model_len(args)),
           "--seed", "0"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def bench_command(args, model: str, port: int, prompts: str, result_dir: str, name: str,
                  seed: int = 0, level: int | None = None, num_prompts: int | None = None
                  ) -> list[str]:
    """vLLM's client against one server for one cell: the cell's prompts (a jsonl
    for `--dataset-name custom`, the same file for every server of the cell),
    TTFT, TPOT and ITL percentiles 50 and 99."""
    level = level or levels_of(args)[0]
    num_prompts = num_prompts or prompts_at(args, level)
    return [VLLM, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
            "--model", model, "--dataset-name", "custom", "--dataset-path", prompts,
            "--custom-output-len", str(args.output_len),
            "--num-prompts", str(num_prompts), "--max-concurrency", str(level),
            "--temperature", str(args.temperature), "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", result_dir, "--result-filename", name]


def wait_healthy(proc, port: int, log_path: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = open(log_path).read()[-2000:]
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"server on port {port} not healthy after {timeout:.0f} s (log: {log_path})")


def stop(proc) -> None:
    """SIGTERM to the server's own process group (API server, EngineCore, Worker)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def start_servers(group, g, args, model, env, out_dir, commands, failed) -> dict:
    """Start a group's servers (plain first), wait until each is healthy:
    name -> (process, port, log path, family)."""
    servers = {}
    for i, config in enumerate(group):
        name = plain_name(g, config.name) if config.family in ("plain", "control") else config.name
        port = args.port + i
        cmd = server_command(args, model, port, config.spec)
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND")
        commands.append(f"LD_PRELOAD={env.get('LD_PRELOAD', '')} VLLM_CPU_KVCACHE_SPACE="
                        f"{env['VLLM_CPU_KVCACHE_SPACE']} "
                        + (f"VLLM_CPU_OMP_THREADS_BIND={bind} " if bind else "")
                        + "".join(f"{k}={v} " for k, v in config.env.items()) + shlex.join(cmd))
        log_path = os.path.join(out_dir, f"server_g{g}_{port}.log")
        print(f"starting {name} on port {port}: {shlex.join(cmd[1:])}", flush=True)
        server_env = {**env, **config.env}
        if config.family not in ("plain", "control"):  # the proposer's status, at the end
            from vllm_layerskip.core.proposer_stats import STATUS_FILE_ENV  # imports vLLM
            server_env[STATUS_FILE_ENV] = status_path(out_dir, name)
        proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                env=server_env, start_new_session=True)
        servers[name] = (proc, port, log_path, config.family)
    for name, (proc, port, log_path, _) in list(servers.items()):
        try:
            wait_healthy(proc, port, log_path)
            print(f"{name}: up", flush=True)
        except (RuntimeError, TimeoutError) as e:
            failed.append(f"{name}: {str(e).splitlines()[0]}")
            print(f"{name}: {e}", flush=True)
            stop(proc)
            del servers[name]
    return servers


def status_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"status_{re.sub(r'[^A-Za-z0-9.=-]+', '_', name)}.json")


def cost_model_checks(servers, out_dir: str) -> dict:
    """Each speculative server's cost-model figures from its last status
    (VLLM_LAYERSKIP_STATUS_FILE, rewritten after every step): what it weighed
    against what drafting steps took, per batch-size bucket, and how often it
    drafted. Servers without the plugin's status (vLLM's own methods) are left out."""
    checks = {}
    for name, (_, _, _, family) in servers.items():
        path = status_path(out_dir, name)
        if family in ("plain", "control") or not os.path.exists(path):
            continue
        with open(path) as f:
            cost_model = json.load(f).get("cost_model")
        if cost_model:
            keep = ("steps", "drafting_fraction", "lookup_steps", "lookup_steps_prefilling",
                    "verify_ms", "draft_ms", "predicted_against_measured")
            checks[name] = {k: cost_model.get(k) for k in keep}
    return checks


def cost_model_lines(checks: dict) -> list[str]:
    """The report's lines: per server and batch-size bucket, drafting steps'
    verify seconds and draft forwards' seconds, predicted and measured."""
    lines = []
    for name, c in checks.items():
        pam = c.get("predicted_against_measured") or {}
        parts = []
        for kind in ("verify", "draft"):
            for bucket, v in (pam.get(kind) or {}).items():
                if v["steps"]:
                    parts.append(f"{kind} at {bucket} requests {v['predicted_ms']:.1f} ms predicted, "
                                 f"{v['measured_ms']:.1f} measured ({v['steps']} steps)")
        lines.append(f"- {name}: self-drafted in {100 * (c.get('drafting_fraction') or 0):.1f}% of "
                     f"{c.get('steps')} steps, copies in {c.get('lookup_steps')} "
                     f"({c.get('lookup_steps_prefilling')} of them beside prompt chunks); "
                     + ("; ".join(parts) or "no drafting step measured"))
    return lines


# ---- prompts ---------------------------------------------------------------------

def prompt_tag(r: int, level: int, i: int) -> str:
    """The first line of a long prompt: distinct per round, level and prompt."""
    return f"Request {r + 1}.{level}.{i + 1}.\n\n"


def long_prompt_files(args, model: str, out_dir: str) -> dict[tuple, str]:
    """(prompt tokens, round, level) -> a jsonl of that cell's prompts for vLLM's
    custom dataset: prompt i of a round is the same text at every level (its
    first line aside), another text in another round."""
    from benchlib.long_prompts import build_prompts, token_counter, write_jsonl

    count = token_counter(model)
    files = {}
    for length in args.prompt_tokens:
        for r in range(args.rounds):
            for level in levels_of(args):
                n = prompts_at(args, level)
                prompts = build_prompts(count, length, n, start=5 * r,
                                        tags=[prompt_tag(r, level, i) for i in range(n)])
                path = os.path.join(out_dir, f"prompts_{length}_round{r}_c{level}.jsonl")
                files[(length, r, level)] = write_jsonl(path, prompts, args.output_len)
            sizes = [p["prompt_tokens"] for p in prompts]
            print(f"prompts of ~{length} tokens, round {r + 1}: {len(sizes)} at the top level, "
                  f"{min(sizes)}-{max(sizes)} tokens", flush=True)
    return files


def spec_bench_files(args, questions: str, out_dir: str) -> dict[tuple, str]:
    """(None, round, level) -> a jsonl of that cell's Spec-Bench first turns for
    vLLM's custom dataset, a sample of its own (seed 1000 * round + the level's
    index). vLLM 0.32's `--dataset-name spec_bench` ignores `--seed` (its shuffle
    always uses the default seed), so every round would repeat the first round's
    prompts: plain's prefill hits the prefix cache and `suffix` finds the earlier
    round's answers in its tree (acceptance length 6.35 against 1.49 the round
    before, serve_20261203-163439)."""
    from benchlib.long_prompts import write_jsonl

    from vllm_layerskip.core.measure import read_questions

    texts = [q["prompt"] for q in read_questions(questions)
             if not args.category or q["category"] == args.category]
    files = {}
    for r in range(args.rounds):
        for index, level in enumerate(levels_of(args)):
            n = min(prompts_at(args, level), len(texts))
            pick = np.random.default_rng(1000 * r + index).choice(len(texts), size=n, replace=False)
            prompts = [{"prompt": texts[i], "kind": "spec_bench", "prompt_tokens": None} for i in pick]
            path = os.path.join(out_dir, f"prompts_spec_bench_round{r}_c{level}.jsonl")
            files[(None, r, level)] = write_jsonl(path, prompts, args.output_len)
    return files


# ---- the sweep -------------------------------------------------------------------

def sweep_cells(args, r: int) -> list[tuple[int | None, int]]:
    """(prompt tokens or None for Spec-Bench, level) in round r's order: levels
    up in even rounds, down in odd ones, for each prompt length."""
    levels = levels_of(args)
    return [(length, level) for length in (args.prompt_tokens or [None])
            for level in (levels if r % 2 == 0 else levels[::-1])]


def cell_label(length: int | None, level: int) -> str:
    return ("spec_bench" if length is None else f"p{length}") + f"_c{level}"


def keep_scalars(result: dict) -> dict:
    """vLLM's result without its per-request lists (they stay in its own file)."""
    return {k: v for k, v in result.items()
            if not isinstance(v, (list, dict)) or k == "spec_decode_per_position_acceptance_rates"}


def run_sweep(servers, g, args, model, prompt_files, out_dir, env, commands,
              failed, records) -> None:
    """`vllm bench serve` against every server for every cell, --rounds times."""
    names = list(servers)
    orders = williams_orders(len(names))
    t = 0
    for r in range(args.rounds):
        for length, level in sweep_cells(args, r):
            order = orders[t % len(orders)]
            t += 1
            n = prompts_at(args, level)
            for i in order:
                name = names[i]
                _, port, _, family = servers[name]
                fname = (f"{re.sub(r'[^A-Za-z0-9.=-]+', '_', name)}_{cell_label(length, level)}"
                         f"_round{r}.json")
                cmd = bench_command(args, model, port, prompt_files[(length, r, level)], out_dir,
                                    fname, seed=r, level=level, num_prompts=n)
                if r == 0:
                    commands.append(shlex.join(cmd))
                what = f"{name}, {'Spec-Bench' if length is None else f'~{length}-token prompts'}"
                print(f"[round {r + 1}/{args.rounds}] {what}, concurrency {level}, {n} prompts: "
                      "vllm bench serve ...", flush=True)
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                with open(os.path.join(out_dir, fname.replace(".json", ".log")), "w") as f:
                    f.write(done.stdout + done.stderr)
                if done.returncode != 0:
                    failed.append(f"{what}, concurrency {level}, round {r + 1}: vllm bench serve "
                                  f"exited {done.returncode}: {done.stderr[-500:]}")
                    print(failed[-1], flush=True)
                    continue
                # vLLM's own summary block, as it printed it.
                block = done.stdout[done.stdout.find("============ Serving Benchmark Result"):]
                print(block.strip(), flush=True)
                with open(os.path.join(out_dir, fname)) as f:
                    result = json.load(f)
                records.append({"group": g, "config": name, "family": family,
                                "prompt_tokens": length, "level": level, "round": r,
                                "num_prompts": n, "result": keep_scalars(result)})


# ---- figures ---------------------------------------------------------------------

def _tps(runs: list[dict]) -> float:
    return sum(x["total_output_tokens"] for x in runs) / sum(x["duration"] for x in runs)


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def speedup_interval(pairs: list[tuple[dict, dict]], reps: int = BOOTSTRAP_REPS,
                     seed: int = 0) -> tuple[float | None, float | None, str | None]:
    """(low, high, kind) of the speedup over rounds from (config's result,
    plain's result) per round: none with one round, the lowest and highest
    per-round ratio with 2-3, a 95% bootstrap over rounds (ratio of sums, as
    the point figure) with 4 or more."""
    if len(pairs) < 2:
        return None, None, None
    if len(pairs) < BOOTSTRAP_ROUNDS:
        ratios = [_tps([a]) / _tps([b]) for a, b in pairs]
        return min(ratios), max(ratios), "min-max"
    cols = np.asarray([[a["total_output_tokens"], a["duration"], b["total_output_tokens"],
                        b["duration"]] for a, b in pairs], dtype=float)
    pick = np.random.default_rng(seed).integers(0, len(pairs), size=(reps, len(pairs)))
    s = cols[pick].sum(axis=1)
    ratios = (s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3])
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high), "bootstrap"


def summarize(records: list[dict]) -> list[dict]:
    """One row per (group, config, prompt length, level), rows by prompt length,
    then configuration (in run order), then level. Speedups and TTFT ratios are
    over the plain server of the same group, cell and rounds."""
    plain = {(x["group"], x["prompt_tokens"], x["level"], x["round"]): x["result"]
             for x in records if x["family"] == "plain"}
    lengths = list(dict.fromkeys(x["prompt_tokens"] for x in records))
    configs = list(dict.fromkeys((x["group"], x["config"]) for x in records))
    keys = sorted(dict.fromkeys((x["prompt_tokens"], x["group"], x["config"], x["level"])
                                for x in records),
                  key=lambda k: (lengths.index(k[0]), configs.index((k[1], k[2])), k[3]))
    rows = []
    for length, g, config, level in keys:
        mine = sorted((x for x in records if (x["prompt_tokens"], x["group"], x["config"],
                                              x["level"]) == (length, g, config, level)),
                      key=lambda x: x["round"])
        runs = [x["result"] for x in mine]
        pairs = [(x["result"], plain[(g, length, level, x["round"])]) for x in mine
                 if (g, length, level, x["round"]) in plain]
        # plain's own row: 1.00 by construction, no interval
        low, high, kind = speedup_interval(pairs) if mine[0]["family"] != "plain" else (None,) * 3
        drafts = sum(x.get("spec_decode_num_drafts", 0) for x in runs)
        drafted = sum(x.get("spec_decode_draft_tokens", 0) for x in runs)
        accepted = sum(x.get("spec_decode_accepted_tokens", 0) for x in runs)
        rows.append({
            "config": config, "group": g, "family": mine[0]["family"], "prompt_tokens": length,
            "level": level, "rounds": len(runs), "requests": sum(x["completed"] for x in runs),
            "output_tokens": sum(x["total_output_tokens"] for x in runs),
            "seconds": sum(x["duration"] for x in runs), "tokens_per_second": _tps(runs),
            "speedup": _tps([a for a, _ in pairs]) / _tps([b for _, b in pairs]) if pairs else None,
            "speedup_low": low, "speedup_high": high, "interval": kind,
            "round_speedups": [_tps([a]) / _tps([b]) for a, b in pairs],
            "tpot_p50_ms": _median([x.get("median_tpot_ms") for x in runs]),
            "ttft_p50_ms": _median([x.get("median_ttft_ms") for x in runs]),
            "ttft_p99_ms": _median([x.get("p99_ttft_ms") for x in runs]),
            "M": 1 + accepted / drafts if drafts else None,
            "alpha": accepted / drafted if drafted else None,
            # How much the cost model drafts (copies and self-drafts alike): it
            # should fall as load rises and come back when load falls.
            "drafted_per_output": (drafted / max(sum(x["total_output_tokens"] for x in runs), 1)
                                   if mine[0]["family"] not in ("plain", "control") else None),
        })
    ttft = {(r["group"], r["prompt_tokens"], r["level"]): r["ttft_p50_ms"]
            for r in rows if r["family"] == "plain"}
    for r in rows:
        ref = ttft.get((r["group"], r["prompt_tokens"], r["level"]))
        r["ttft_vs_plain"] = r["ttft_p50_ms"] / ref if ref and r["ttft_p50_ms"] is not None else None
    return rows


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def interval_cell(r: dict) -> str:
    return "-" if r["speedup_low"] is None else f"{r['speedup_low']:.2f}-{r['speedup_high']:.2f}"


def workload_title(length: int | None) -> str:
    return ("Spec-Bench" if length is None
            else f"the project's prompts of ~{length} tokens (code to edit, documents to answer from)")


def table(rows: list[dict], length: int | None) -> str:
    lines = ["| config | concurrency | requests | output tok/s | speedup | interval | TPOT p50 ms | "
             "TTFT p50 ms | TTFT p99 ms | TTFT p50 / plain | acceptance length | acceptance rate | "
             "draft tokens / output token |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["prompt_tokens"] != length:
            continue
        lines.append(f"| {r['config']} | {r['level']} | {r['requests']} | "
                     f"{r['tokens_per_second']:.1f} | {fmt(r['speedup'])} | {interval_cell(r)} | "
                     f"{fmt(r['tpot_p50_ms'], '.1f')} | {fmt(r['ttft_p50_ms'], '.1f')} | "
                     f"{fmt(r['ttft_p99_ms'], '.1f')} | {fmt(r['ttft_vs_plain'])} | {fmt(r['M'])} | "
                     f"{fmt(r['alpha'])} | {fmt(r['drafted_per_output'])} |")
    return "\n".join(lines)


def stops_paying(rows: list[dict], length: int | None) -> list[str]:
    """Per speculative configuration: the first level (ascending) whose speedup
    is below PAYS, or that it pays at every level measured."""
    lines = []
    mine = [r for r in rows if r["prompt_tokens"] == length and r["family"] not in ("plain", "control")
            and r["speedup"] is not None]
    for config in dict.fromkeys(r["config"] for r in mine):
        levels = sorted((r for r in mine if r["config"] == config), key=lambda r: r["level"])
        below = next((r for r in levels if r["speedup"] < PAYS), None)
        if below is None:
            lines.append(f"- {config}: pays at every level measured "
                         f"({', '.join(str(r['level']) for r in levels)})")
        else:
            lines.append(f"- {config}: stops paying at concurrency {below['level']} "
                         f"(speedup {below['speedup']:.2f} < {PAYS:.2f})")
    return lines


def interval_note(rows: list[dict]) -> str:
    kinds = {r["interval"] for r in rows if r["interval"]}
    rounds = sorted({r["rounds"] for r in rows})
    this = {"min-max": "the lowest and highest of the per-round speedups",
            "bootstrap": f"a 95% bootstrap over rounds ({BOOTSTRAP_REPS} resamples of the rounds, "
                         "ratio of sums as the point figure)"}
    said = "; ".join(this[k] for k in sorted(kinds)) or "none (one round)"
    return (f"Speedup: output tokens/s over the plain server's of the same group, summed over "
            f"{'/'.join(map(str, rounds))} round(s). Interval: {said} (2-3 rounds: min-max; "
            f"{BOOTSTRAP_ROUNDS} or more: bootstrap). TPOT and TTFT: the median over rounds of vLLM's "
            "per-round p50/p99. Acceptance length M = 1 + accepted / drafts, rate = accepted / "
            "drafted tokens, draft tokens / output token = drafted tokens over output tokens "
            "(vLLM's spec-decode counters, copies and self-drafts alike, summed over rounds). The A/A control's "
            "row is the noise floor of every column.")


def header(run: dict) -> str:
    a = run["args"]
    lengths = a.get("prompt_tokens")
    prompts = (f"{a['num_prompts']} prompts" if not a.get("prompts_per_level")
               else f"max({a['num_prompts']}, {a['prompts_per_level']} x concurrency) prompts")
    workload = ("Spec-Bench first turns, a sample per round and level" + (f" ({a['category']})" if a.get("category") else "")
                if not lengths else
                f"`--dataset-name custom`, the project's prompts of ~{', '.join(map(str, lengths))} tokens")
    return (f"# `vllm bench serve` sweep, {os.path.basename(os.path.normpath(run['model']))}, "
            f"{run['stamp']}\n\n`{run.get('command', 'bench_serve.py')}`\n\n"
            f"{workload}; {prompts} a server and cell, output {a['output_len']} tokens, max "
            f"concurrency {', '.join(map(str, levels_of(a)))}, temperature {a['temperature']:g}, "
            f"{a['rounds']} round(s), K={a['k']}, dtype={a['dtype']}, {run.get('groups', 1)} "
            "group(s) of servers up at once.")


def render(run: dict) -> tuple[str, list[dict]]:
    """The report's markdown and its rows, from a run's records."""
    rows = summarize(run["records"])
    lines = [header(run), ""]
    for length in dict.fromkeys(r["prompt_tokens"] for r in rows):
        lines += [f"## {workload_title(length)}", "", table(rows, length), "",
                  f"Where speculation stops paying (speedup below {PAYS:.2f}):", ""]
        lines += stops_paying(rows, length) or ["- no speculative configuration measured"]
        lines.append("")
    lines += [interval_note(rows), ""]
    if run.get("cost_model"):
        lines += ["The cost model at the end of the run (each server's last status; buckets by "
                  "requests in the step; prediction made before the step's measurement joined "
                  "the estimate):", ""] + cost_model_lines(run["cost_model"]) + [""]
    failed = run.get("failed") or []
    if isinstance(failed, dict):
        failed = [f"{k}: {v}" for k, v in failed.items()]
    lines += [f"- {n}: skipped, {why}" for n, why in (run.get("skipped") or {}).items()]
    lines += [f"- failed: {f}" for f in failed]
    lines += ["", "Commands (round 1):", "", "```"] + list(run.get("commands", [])) + ["```"]
    return "\n".join(lines) + "\n", rows


def plot(base: str, rows: list[dict]) -> str | None:
    """BASE.png: speedup against concurrency (log2), one line per configuration
    with its interval as error bars, one panel per prompt length."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        print("matplotlib is not installed: no plot (.venv/bin/pip install matplotlib)")
        return None
    lengths = list(dict.fromkeys(r["prompt_tokens"] for r in rows))
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.4 * len(lengths), 4.4), squeeze=False,
                             sharey=True)
    for ax, length in zip(axes[0], lengths):
        mine = [r for r in rows if r["prompt_tokens"] == length and r["family"] != "plain"
                and r["speedup"] is not None]
        levels = sorted({r["level"] for r in rows if r["prompt_tokens"] == length})
        for config in dict.fromkeys(r["config"] for r in mine):
            pts = sorted((r for r in mine if r["config"] == config), key=lambda r: r["level"])
            y = np.array([r["speedup"] for r in pts])
            low = np.array([r["speedup"] if r["speedup_low"] is None else r["speedup_low"] for r in pts])
            high = np.array([r["speedup"] if r["speedup_high"] is None else r["speedup_high"]
                             for r in pts])
            control = pts[0]["family"] == "control"
            ax.errorbar([r["level"] for r in pts], y, yerr=[y - low, high - y], marker="o",
                        capsize=3, label=config, linestyle=":" if control else "-",
                        color="gray" if control else None)
        ax.axhline(1.0, linestyle="--", color="black", linewidth=1)
        ax.axhline(PAYS, linestyle="--", color="tab:red", linewidth=1, label=f"{PAYS:.2f}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("max concurrency")
        ax.set_title("Spec-Bench" if length is None else f"~{length}-token prompts", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("speedup over plain (output tok/s)")
    kinds = {r["interval"] for r in rows if r["interval"]}
    bars = {"min-max": "lowest-highest per-round speedup", "bootstrap": "95% bootstrap over rounds"}
    fig.suptitle("error bars: " + (", ".join(bars[k] for k in sorted(kinds)) or "none (one round)"),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=110)
    plt.close(fig)
    return base + ".png"


def write_report(base: str, run: dict, save_json: bool = True) -> str:
    text, rows = render(run)
    print("\n" + text)
    with open(base + ".md", "w") as f:
        f.write(text)
    if save_json:
        with open(base + ".json", "w") as f:
            json.dump({**run, "rows": rows}, f, indent=1, default=str)
    plot(base, rows)
    return text


def records_from_results(run: dict) -> list[dict]:
    """A run saved before the sweep ({"results": {name: [vLLM results]}}, one
    --max-concurrency) as records. Its names came group by group, each group's
    plain first ("plain [group N]" from the second on)."""
    records, g = [], 0
    for name, results in run["results"].items():
        group = re.search(r" \[group (\d+)\]$", name)
        g = int(group.group(1)) - 1 if group else g
        family = ("control" if "A/A control" in name else
                  "plain" if re.fullmatch(r"plain( \[group \d+\])?", name) else "spec")
        for r, result in enumerate(results):
            records.append({"group": g, "config": name,
                            "family": family, "prompt_tokens": None,
                            "level": run["args"]["max_concurrency"], "round": r,
                            "result": keep_scalars(result)})
    return records


def rerender(path: str) -> str:
    """--from-json: the .md and .png beside the .json again, from its records."""
    with open(path) as f:
        run = json.load(f)
    if "records" not in run:
        run["records"] = records_from_results(run)
        run["args"]["max_concurrency"] = [run["args"]["max_concurrency"]]
    run.setdefault("model", run["args"].get("model") or "?")
    run.setdefault("stamp", os.path.basename(path)[len("serve_"):-len(".json")])
    return write_report(path[: -len(".json")], run, save_json=False)


def main() -> None:
    args = parse_args()
    if args.from_json:
        rerender(args.from_json)
        return
    from vllm_layerskip.tools.prepare_model import ensure_default_model
    from vllm_layerskip.tools.prompts import benchmark_dataset

    model = model_path(args.model) if args.model else ensure_default_model()
    questions = None if args.prompt_tokens else benchmark_dataset(args.dataset_path)
    configs = build_configs(args, model)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.join(args.out, f"serve_{stamp}")
    os.makedirs(out_dir, exist_ok=True)
    prompt_files = (long_prompt_files(args, model, out_dir) if args.prompt_tokens
                    else spec_bench_files(args, questions, out_dir))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib)))
    env.setdefault("NUMBA_THREADING_LAYER", "workqueue")  # ngram at its best: bench_methods.py says why
    from vllm_layerskip.tools.cpu_threads import bind_every_core
    bind_every_core(env)  # each server's worker gets every core of a small machine, as in bench_methods
    env = with_iomp_preloaded(env)

    commands, failed, records, checks = [], [], [], {}
    skipped = {c.name: c.skip_reason for c in configs if not c.runs}
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
    runnable = [c for c in configs if c.runs]
    max_servers = args.max_servers or engines_that_fit(2.0, SERVER_GIB + args.kv_cache_gib)
    groups = engine_groups(runnable, max(2, max_servers))
    for g, group in enumerate(groups):
        servers = start_servers(group, g, args, model, env, out_dir, commands, failed)
        try:
            run_sweep(servers, g, args, model, prompt_files, out_dir, env, commands,
                      failed, records)
            checks.update(cost_model_checks(servers, out_dir))
        finally:
            for proc, _, _, _ in servers.values():
                stop(proc)

    run = {"args": vars(args), "model": model, "stamp": stamp, "groups": len(groups),
           "command": " ".join(["bench_serve.py", *sys.argv[1:]]), "commands": commands,
           "records": records, "skipped": skipped, "failed": failed, "cost_model": checks}
    write_report(out_dir, run)
    print(f"\nsaved {out_dir}.md/.json/.png, logs, prompts and vLLM result files in {out_dir}/")


if __name__ == "__main__":
    main()
