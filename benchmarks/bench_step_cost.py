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
2. the LM head at batch 1, full and at pruned draft-vocabulary sizes, beside one
   decoder layer's linear layers, all through vLLM's CPU GEMM dispatch (the one the
   model and the pruned draft head use): the head's share of a step's matmul time
   on this machine, and so how much a pruned draft head can lower c here;
3. plain decoding with vLLM at batch 1 and batch N (tokens/s and the cost of a
   step of N tokens in steps of 1), and the head again inside the engine's worker
   (the model's own compute_logits against the plugin's slice), unless --no-engine.

    .venv/bin/python benchmarks/bench_step_cost.py --model ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.head_probe import ms_per_call  # noqa: E402 - after the path


def linear_costs(hidden: int, intermediate: int, threads: int, rows=(1, 2, 4, 8)) -> list[tuple]:
    import torch

    torch.set_num_threads(threads)
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        weight = torch.randn(intermediate, hidden, dtype=dtype)
        base = None
        for n in rows:
            x = torch.randn(n, hidden, dtype=dtype)
            ms = ms_per_call(lambda: torch.nn.functional.linear(x, weight), 20)
            base = base or ms
            out.append((str(dtype).replace("torch.", ""), n, ms, ms / base))
    return out


def head_costs(hidden: int, intermediate: int, qkv: int, vocab: int, sizes: list[int],
               threads: int, repeats: int = 20) -> tuple[list[tuple], float]:
    """ms for one token through the LM head at each size (the full vocabulary
    first) and through one decoder layer's four linear layers, bf16, with vLLM's
    CPU GEMM dispatch. The rows are random: a GEMM's time does not depend on
    the values. ([(size, ms)], layer ms)"""
    import torch
    from torch import nn
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    torch.set_num_threads(threads)

    def linear(rows: int, cols: int):
        layer = nn.Module()
        layer.weight = nn.Parameter(torch.randn(rows, cols, dtype=torch.bfloat16),
                                    requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        run = getattr(layer, "cpu_linear", None) or nn.functional.linear
        return lambda x: run(x, layer.weight, None)

    x = torch.randn(1, hidden, dtype=torch.bfloat16)
    heads = []
    for size in [vocab, *sizes]:
        run = linear(size, hidden)
        heads.append((size, ms_per_call(lambda: run(x), repeats)))
    layer_ms = 0.0
    for rows, cols in ((qkv, hidden), (hidden, hidden), (2 * intermediate, hidden),
                       (hidden, intermediate)):
        run, x_in = linear(rows, cols), torch.randn(1, cols, dtype=torch.bfloat16)
        layer_ms += ms_per_call(lambda: run(x_in), repeats)
    return heads, layer_ms


def plain_decoding(model: str, dtype: str, batch: int, max_tokens: int,
                   head_sizes: list[int]) -> tuple[list[tuple], dict]:
    """[(requests, tokens/s, s per step)] and the LM head's times inside the
    engine's worker (benchlib/head_probe.py)."""
    import functools

    from vllm import LLM, SamplingParams

    from benchlib.head_probe import head_times

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
    heads = llm.apply_model(functools.partial(head_times, sizes=head_sizes))[0]
    return out, heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8, help="requests decoded together")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1536, help="linear layer: input size")
    ap.add_argument("--intermediate", type=int, default=8960, help="linear layer: output size")
    ap.add_argument("--qkv", type=int, default=2048,
                    help="decoder layer: q, k and v outputs together (Qwen2.5-1.5B: 1536 + 2 x 256)")
    ap.add_argument("--layers", type=int, default=28, help="decoder layers")
    ap.add_argument("--vocab", type=int, default=151936, help="LM head rows")
    ap.add_argument("--head-sizes", type=int, nargs="*", default=[65536, 32768],
                    help="pruned draft-vocabulary sizes to time the head at")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the linear layer (vLLM's CPU worker on 2 cores: 1)")
    ap.add_argument("--no-engine", action="store_true", help="the linear layers only")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model
    # The worker unpickles head_times by its module name: benchlib must be importable there.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))

    from benchlib.report import cpu_vector_isa

    print(f"CPU: {os.cpu_count()} cores, {cpu_vector_isa()}")
    print(f"\nLinear {args.hidden} -> {args.intermediate}, {args.threads} thread(s):")
    print("| dtype | rows | ms | x one row |\n|---|---:|---:|---:|")
    for dtype, n, ms, rel in linear_costs(args.hidden, args.intermediate, args.threads):
        print(f"| {dtype} | {n} | {ms:.2f} | {rel:.2f} |")
    heads, layer_ms = head_costs(args.hidden, args.intermediate, args.qkv, args.vocab,
                                 args.head_sizes, args.threads)
    step_ms = args.layers * layer_ms + heads[0][1]
    print(f"\nLM head at batch 1, bf16, vLLM's CPU GEMM dispatch, {args.threads} thread(s); "
          f"one decoder layer's linear layers {layer_ms:.2f} ms, x {args.layers} layers + "
          f"the full head = {step_ms:.1f} ms of matmuls a decode step:")
    print("| head rows | ms | x full head | share of the step's matmuls | c can fall by |\n"
          "|---:|---:|---:|---:|---:|")
    for size, ms in heads:
        print(f"| {size} | {ms:.2f} | {ms / heads[0][1]:.2f} | {ms / step_ms:.3f} | "
              f"{(heads[0][1] - ms) / step_ms:.3f} |")
    if args.no_engine:
        return
    print(f"\nPlain decoding, {os.path.basename(args.model)}, {args.dtype}, "
          f"{args.max_tokens} tokens per request:")
    print("| requests | tokens/s | s per step | step x batch-1 step |\n|---:|---:|---:|---:|")
    rows, engine_heads = plain_decoding(args.model, args.dtype, args.batch, args.max_tokens,
                                        args.head_sizes)
    for n, tps, step in rows:
        print(f"| {n} | {tps:.2f} | {step:.3f} | {step / rows[0][2]:.2f} |")
    step_ms = rows[0][2] * 1e3
    full = engine_heads["full"]
    print(f"\nLM head inside the engine's worker ({engine_heads['threads']} torch thread(s)), "
          f"one token, against the batch-1 step above ({step_ms:.0f} ms):")
    print("| head | ms | share of a decode step | c can fall by |\n|---|---:|---:|---:|")
    print(f"| full ({args.vocab} ids, the model's compute_logits) | {full:.2f} | "
          f"{full / step_ms:.3f} | - |")
    for size in args.head_sizes:
        ms = engine_heads[size]
        print(f"| pruned, {size} ids (the plugin's slice) | {ms:.2f} | {ms / step_ms:.3f} | "
              f"{(full - ms) / step_ms:.3f} |")


if __name__ == "__main__":  # vLLM's CPU executor spawns processes
    main()
