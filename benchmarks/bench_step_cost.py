"""What an extra token in a decode step costs on this machine: the question that
decides whether any speculative method can pay here.

Speculation pays only where verifying 1 + k tokens costs little more than decoding
one. Where a step is memory-bound (weights read once for every token of the step)
that holds; where it is compute-bound it does not, and no draft pays, not even a
copied one. Two CPUs both named "AMD EPYC" here fell on either side of that line
for Qwen2.5-Coder-1.5B in bf16 (benchmarks/RESULTS.md), so this prints, in a few
minutes:

1. a bf16/fp32 linear layer of the model's MLP shape at 1, 2, 4, 8 rows (torch alone,
   vLLM's thread count), each relative to one row;
2. plain decoding with vLLM at batch 1 and batch N (tokens/s and the cost of a
   step of N tokens in steps of 1), unless --no-engine.

    .venv/bin/python benchmarks/bench_step_cost.py --model ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def linear_costs(hidden: int, intermediate: int, threads: int, rows=(1, 2, 4, 8)) -> list[tuple]:
    import torch

    torch.set_num_threads(threads)
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        weight = torch.randn(intermediate, hidden, dtype=dtype)
        base = None
        for n in rows:
            x = torch.randn(n, hidden, dtype=dtype)
            for _ in range(3):
                torch.nn.functional.linear(x, weight)
            start = time.perf_counter()
            for _ in range(20):
                torch.nn.functional.linear(x, weight)
            ms = (time.perf_counter() - start) / 20 * 1e3
            base = base or ms
            out.append((str(dtype).replace("torch.", ""), n, ms, ms / base))
    return out


def plain_decoding(model: str, dtype: str, batch: int, max_tokens: int) -> list[tuple]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=2048)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    prompt = "Write a Python function that sorts a list of dictionaries by a key."
    llm.generate([prompt], params, use_tqdm=False)  # warm-up
    out = []
    for n in (1, batch):
        start = time.perf_counter()
        llm.generate([prompt] * n, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        out.append((n, n * max_tokens / seconds, seconds / max_tokens))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8, help="requests decoded together")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1536, help="linear layer: input size")
    ap.add_argument("--intermediate", type=int, default=8960, help="linear layer: output size")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the linear layer (vLLM's CPU worker on 2 cores: 1)")
    ap.add_argument("--no-engine", action="store_true", help="the linear layer only")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from benchlib.report import cpu_vector_isa

    print(f"CPU: {os.cpu_count()} cores, {cpu_vector_isa()}")
    print(f"\nLinear {args.hidden} -> {args.intermediate}, {args.threads} thread(s):")
    print("| dtype | rows | ms | x one row |\n|---|---:|---:|---:|")
    for dtype, n, ms, rel in linear_costs(args.hidden, args.intermediate, args.threads):
        print(f"| {dtype} | {n} | {ms:.2f} | {rel:.2f} |")
    if args.no_engine:
        return
    print(f"\nPlain decoding, {os.path.basename(args.model)}, {args.dtype}, "
          f"{args.max_tokens} tokens per request:")
    print("| requests | tokens/s | s per step | step x batch-1 step |\n|---:|---:|---:|---:|")
    rows = plain_decoding(args.model, args.dtype, args.batch, args.max_tokens)
    for n, tps, step in rows:
        print(f"| {n} | {tps:.2f} | {step:.3f} | {step / rows[0][2]:.2f} |")


if __name__ == "__main__":  # vLLM's CPU executor spawns processes
    main()
