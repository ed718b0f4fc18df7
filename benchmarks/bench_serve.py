"""The same comparison through vLLM's own tooling: one `vllm serve` per
configuration, measured with `vllm bench serve --dataset-name spec_bench`.

The servers of a group start first (each on its own loopback port; as many as
free memory holds, ~4.6 GiB each, plain first in every group) and stay up; then,
for each round, `vllm bench serve` runs against every server of the group in a
balanced order (Williams Latin square, as in bench_methods.py, at the granularity
vLLM's client allows). Each server is a process group of its own, stopped when
its group is done with SIGTERM (SIGKILL after 30 s). Prints the commands it runs, a markdown
table (output tok/s, speedup over plain, TPOT, TTFT, vLLM's acceptance length
and rate) and writes OUT/serve_<timestamp>.md/.json plus every server log.

    python benchmarks/bench_serve.py --quick
    python benchmarks/bench_serve.py --methods plain ngram swift --num-prompts 26 --max-concurrency 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.configs import DEFAULT_METHODS, METHODS, build_configs, engine_groups  # noqa: E402
from benchlib.figures import plain_name  # noqa: E402
from benchlib.engines import engines_that_fit, with_iomp_preloaded  # noqa: E402
from benchlib.workloads import williams_orders  # noqa: E402
from vllm_layerskip.tools.cpu_threads import bind_every_core  # noqa: E402

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")
# Memory of one `vllm serve` besides its KV cache: API server ~1 GiB, EngineCore
# ~0.8 GiB, Worker ~1.5 GiB (SmolLM2, float32).
SERVER_GIB = 3.6


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--dataset-path", default=None,
                   help="Spec-Bench's question.jsonl (default: $SPEC_BENCH_QUESTIONS, or beside the "
                        "checkout; without either, the project's own prompts, with a notice)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.45])
    p.add_argument("--swift-ratio", type=float, default=None)
    p.add_argument("--clasp-ratio", type=float, default=None)
    p.add_argument("--method-options", type=json.loads, default={})
    p.add_argument("--draft-length", nargs="+", choices=("adaptive", "fixed"), default=["adaptive"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-prompts", type=int, default=26)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-concurrency", type=int, default=1)
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
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        if "--num-prompts" not in given:
            args.num_prompts = 8
        if "--output-len" not in given:
            args.output_len = 32
    return args


def server_command(args, model: str, port: int, spec: dict | None) -> list[str]:
    cmd = [VLLM, "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", args.dtype, "--enforce-eager", "--max-model-len", "2048", "--seed", "0"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def bench_command(args, model: str, port: int, questions: str, result_dir: str, name: str,
                  seed: int = 0) -> list[str]:
    """vLLM's client; `seed` picks the sample of questions (the same for every
    server in a round, a new one per round)."""
    cmd = [VLLM, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--model", model, "--dataset-name", "spec_bench", "--dataset-path", questions,
           "--num-prompts", str(args.num_prompts), "--spec-bench-output-len", str(args.output_len),
           "--max-concurrency", str(args.max_concurrency), "--temperature", str(args.temperature),
           "--seed", str(seed), "--save-result", "--result-dir", result_dir,
           "--result-filename", name]
    if args.category:
        cmd += ["--spec-bench-category", args.category]
    return cmd


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
    """Start a group's servers (plain first), wait until each is healthy."""
    servers = {}
    for i, config in enumerate(group):
        name = plain_name(g, config.name) if config.family in ("plain", "control") else config.name
        port = args.port + i
        cmd = server_command(args, model, port, config.spec)
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND")
        commands.append(f"LD_PRELOAD={env.get('LD_PRELOAD', '')} VLLM_CPU_KVCACHE_SPACE="
                        f"{env['VLLM_CPU_KVCACHE_SPACE']} "
                        + (f"VLLM_CPU_OMP_THREADS_BIND={bind} " if bind else "") + shlex.join(cmd))
        log_path = os.path.join(out_dir, f"server_g{g}_{port}.log")
        print(f"starting {name} on port {port}: {shlex.join(cmd[1:])}", flush=True)
        proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        servers[name] = (proc, port, log_path)
    for name, (proc, port, log_path) in list(servers.items()):
        try:
            wait_healthy(proc, port, log_path)
            print(f"{name}: up", flush=True)
        except (RuntimeError, TimeoutError) as e:
            failed[name] = str(e).splitlines()[0]
            print(f"{name}: {e}", flush=True)
            stop(proc)
            del servers[name]
    return servers


def run_rounds(servers, args, model, questions, out_dir, env, commands, failed, results) -> None:
    """`vllm bench serve` against every server, --rounds times, balanced order."""
    names = list(servers)
    orders = williams_orders(len(names))
    for r in range(args.rounds):
        for i in orders[r % len(orders)]:
            name = names[i]
            _, port, _ = servers[name]
            fname = f"{name.replace(' ', '_').replace('/', '_')}_round{r}.json"
            cmd = bench_command(args, model, port, questions, out_dir, fname, seed=r)
            if r == 0:
                commands.append(shlex.join(cmd))
            print(f"[round {r + 1}/{args.rounds}] {name}: vllm bench serve ...", flush=True)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            with open(os.path.join(out_dir, fname.replace(".json", ".log")), "w") as f:
                f.write(done.stdout + done.stderr)
            if done.returncode != 0:
                failed[name] = f"vllm bench serve exited {done.returncode}: {done.stderr[-500:]}"
                print(failed[name], flush=True)
                continue
            # vLLM's own summary block, as it printed it.
            block = done.stdout[done.stdout.find("============ Serving Benchmark Result"):]
            print(block.strip(), flush=True)
            with open(os.path.join(out_dir, fname)) as f:
                results.setdefault(name, []).append(json.load(f))


def summarize(results: dict, names: list[str]) -> list[dict]:
    rows = []
    for name in dict.fromkeys(names):
        runs = results.get(name, [])
        if not runs:
            continue
        tokens = sum(r["total_output_tokens"] for r in runs)
        seconds = sum(r["duration"] for r in runs)
        drafts = sum(r.get("spec_decode_num_drafts", 0) for r in runs)
        drafted = sum(r.get("spec_decode_draft_tokens", 0) for r in runs)
        accepted = sum(r.get("spec_decode_accepted_tokens", 0) for r in runs)
        rows.append({
            "config": name, "requests": sum(r["completed"] for r in runs), "output_tokens": tokens,
            "seconds": seconds, "tokens_per_second": tokens / seconds,
            "mean_tpot_ms": sum(r["mean_tpot_ms"] for r in runs) / len(runs),
            "mean_ttft_ms": sum(r["mean_ttft_ms"] for r in runs) / len(runs),
            "M": 1 + accepted / drafts if drafts else None,
            "alpha": accepted / drafted if drafted else None,
        })
    # Speedup over the plain server of the same group: names come group by
    # group, each group's plain first (the A/A control is not a reference).
    plain_names = {plain_name(g) for g in range(len(rows))}
    plain = None
    for r in rows:
        if r["config"] in plain_names:
            plain = r
        r["speedup"] = r["tokens_per_second"] / plain["tokens_per_second"] if plain else None
    return rows


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    args = parse_args()
    from vllm_layerskip.tools.prepare_model import ensure_default_model
    from vllm_layerskip.tools.prompts import benchmark_dataset

    model = args.model or ensure_default_model()
    questions = benchmark_dataset(args.dataset_path)
    configs = build_configs(args, model)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.join(args.out, f"serve_{stamp}")
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib)))
    env.setdefault("NUMBA_THREADING_LAYER", "workqueue")  # ngram at its best: bench_methods.py says why
    bind_every_core(env)  # each server's worker gets every core of a small machine, as in bench_methods
    env = with_iomp_preloaded(env)

    commands, failed, results, names = [], {}, {}, []
    skipped = {c.name: c.skip_reason for c in configs if not c.runs}
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
    runnable = [c for c in configs if c.runs]
    max_servers = args.max_servers or engines_that_fit(2.0, SERVER_GIB + args.kv_cache_gib)
    groups = engine_groups(runnable, max(2, max_servers))
    for g, group in enumerate(groups):
        servers = start_servers(group, g, args, model, env, out_dir, commands, failed)
        try:
            names += list(servers)
            run_rounds(servers, args, model, questions, out_dir, env, commands, failed, results)
        finally:
            for proc, _, _ in servers.values():
                stop(proc)

    rows = summarize(results, names)
    lines = [
        f"`vllm bench serve --dataset-name spec_bench`, {os.path.basename(model)}, {stamp}: "
        f"{args.num_prompts} prompts" + (f" of {args.category}" if args.category else "")
        + f", output {args.output_len} tokens, max concurrency {args.max_concurrency}, "
        f"temperature {args.temperature:g}, {args.rounds} round(s), K={args.k}, dtype={args.dtype}, "
        f"{len(groups)} group(s) of servers up at once",
        "", "| config | output tok/s | speedup | mean TPOT ms | mean TTFT ms | M | alpha |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['tokens_per_second']:.1f} | {fmt(r['speedup'])} | "
                     f"{r['mean_tpot_ms']:.1f} | {r['mean_ttft_ms']:.1f} | {fmt(r['M'])} | "
                     f"{fmt(r['alpha'])} |")
    lines += [""] + [f"- {n}: skipped, {why}" for n, why in skipped.items()]
    lines += [f"- {n}: failed, {why}" for n, why in failed.items()]
    lines += ["", "Commands:", "", "```"] + commands + ["```"]
    text = "\n".join(lines)
    print("\n" + text)
    with open(out_dir + ".md", "w") as f:
        f.write(text + "\n")
    with open(out_dir + ".json", "w") as f:
        json.dump({"args": vars(args), "commands": commands, "rows": rows, "results": results,
                   "skipped": skipped, "failed": failed}, f, indent=1)
    print(f"\nsaved {out_dir}.md/.json, logs and vLLM result files in {out_dir}/")


if __name__ == "__main__":
    main()
