"""Start, run and stop time of one offline engine with vLLM's default process
layout (engine core and worker spawned) and in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), as the test suite builds most of its engines.
Workload: the SmolLM2 parity test's (8 prompts, one running into max_model_len),
layer_skip K=4 with a fixed sub-layer set. Prints a table; outputs must agree.

    .venv/bin/python benchmarks/bench_engine_startup.py
"""

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # no options
    from conftest import make_llm
    from test_parity_smollm2 import CONFIGS, MAX_MODEL_LEN, run

    from vllm_layerskip.tools.prepare_model import ensure_default_model
    from vllm_layerskip.core.measure import shutdown, spec_decode_counters

    model = ensure_default_model(quiet=True)
    config = {"method": "layer_skip", **CONFIGS["K4-sublayers"]}
    rows, first = [], None
    for layout in ("processes", "in-process", "processes", "in-process"):
        t0 = time.perf_counter()
        llm = make_llm(model, in_process=layout == "in-process", speculative_config=config,
                       max_model_len=MAX_MODEL_LEN)
        t1 = time.perf_counter()
        out = run(llm)["batch"]
        t2 = time.perf_counter()
        drafts = spec_decode_counters(llm).draft_tokens
        shutdown(llm)
        t3 = time.perf_counter()
        first = first or out
        rows.append((layout, t1 - t0, t2 - t1, t3 - t2, drafts, out == first))
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print("| layout | start s | run s | stop s | draft tokens | same outputs |")
    print("|---|---:|---:|---:|---:|:---:|")
    for layout, start, run_s, stop, drafts, same in rows:
        print(f"| {layout} | {start:.1f} | {run_s:.1f} | {stop:.1f} | {drafts} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
