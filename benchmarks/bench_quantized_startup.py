"""How long an engine of method `quantized` (int4 copies of the weights) takes to
start against plain decoding, with the on-disk cache of the copies
(core/draft_weights_cache.py) cold and warm: the time of `LLM(...)`, one engine
at a time, each in a fresh process.

    .venv/bin/python benchmarks/bench_quantized_startup.py [MODEL_DIR] [--runs plain,cold,warm,plain]

bf16, enforce_eager=True (no compilation: what is measured is the load and the
copies), VLLM_CPU_OMP_THREADS_BIND=0-1 unless set, a 2 GiB KV cache unless
VLLM_CPU_KVCACHE_SPACE says otherwise. `cold` starts with an empty
cache folder of its own (a temporary VLLM_LAYERSKIP_CACHE), `warm` with the one
`cold` filled; the user's cache is not touched. `nobind` is plain again without
VLLM_CPU_OMP_THREADS_BIND, to show core/cpu_binding.py's warning. Prints one
line a run and the load average, since other work on the machine slows a start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DEFAULT_MODEL = "~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct"
SPEC = {"method": "quantized", "num_speculative_tokens": 8, "draft_weights": "int4"}


def start_once(model: str, mode: str) -> None:
    """In this process: build the engine, print the seconds as JSON, exit."""
    from vllm import LLM

    kwargs = dict(model=model, dtype="bfloat16", enforce_eager=True, seed=0)
    if mode in ("cold", "warm"):
        kwargs["speculative_config"] = SPEC
    t = time.perf_counter()
    llm = LLM(**kwargs)
    seconds = time.perf_counter() - t
    print("RESULT " + json.dumps({"mode": mode, "seconds": round(seconds, 1),
                                  "load": os.getloadavg()[0]}), flush=True)
    del llm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--runs", default="plain,cold,warm")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log", default=None, help="append each run's output to this file")
    args = parser.parse_args()
    model = os.path.expanduser(args.model)
    if args.child:
        start_once(model, args.child)
        return
    cache = tempfile.mkdtemp(prefix="draft_weights_cache_")
    for mode in args.runs.split(","):
        env = dict(os.environ, VLLM_LAYERSKIP_CACHE=cache)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: a fixed KV cache, no memory probe
        env.pop("VLLM_LAYERSKIP_DRAFT_WEIGHTS_CACHE", None)
        if mode == "nobind":
            env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
        before = os.getloadavg()[0]
        t = time.perf_counter()
        run = subprocess.run([sys.executable, __file__, model, "--child", mode], env=env,
                             capture_output=True, text=True)
        wall = time.perf_counter() - t
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"===== {mode}\n{run.stdout}\n{run.stderr}\n")
        result = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode or not result:
            print(f"{mode}: failed (exit {run.returncode})\n{run.stderr[-3000:]}")
            continue
        data = json.loads(result[-1][len("RESULT "):])
        binding = [line for line in run.stderr.splitlines() if "cores it could use" in line]
        print(f"{mode:6s} LLM(...) {data['seconds']:6.1f} s (process {wall:.0f} s; load average "
              f"{before:.1f} before, {data['load']:.1f} after)"
              + (f"\n       {binding[0].strip()}" if binding else ""), flush=True)
    print(f"cache folder: {cache}")


if __name__ == "__main__":
    main()
