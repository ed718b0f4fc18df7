"""CLaSp's DP step on a GPU: the Triton kernel (kernels/clasp_dp.py) against the
torch reference, one step and the whole layer DP, at the shapes of real models.

Needs a CUDA GPU (the kernel's CPU path is Triton's interpreter, for tests only).
Prints a markdown table and writes it to --out:

    python benchmarks/bench_clasp_kernel.py --out benchmarks/results/clasp_kernel_h100.md

Times are medians of triton.testing.do_bench (warm-up and repeats inside), in
microseconds. "Whole DP" runs layer_dp.clasp_dp end to end with cheap stand-in
layers (h + tanh(h) W), so it adds those matmuls and the DP's per-layer host
work (~23 kernel launches per layer) to the kernel's time.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vllm_layerskip.kernels import clasp_dp as kernel  # noqa: E402
from vllm_layerskip.methods.clasp import layer_dp  # noqa: E402

# (model, hidden size, layers): the DP scores up to M = layers/2 cells per step.
SHAPES = [("SmolLM2-135M", 576, 30), ("Llama-3-8B", 4096, 32), ("Qwen2.5-32B", 5120, 64),
          ("Llama-3-70B", 8192, 80)]


def step_inputs(hidden: int, cells: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(hidden)
    target = torch.randn(hidden, generator=g)
    computed = target + torch.randn(cells, hidden, generator=g)
    skipped = target + 1.5 * torch.randn(cells, hidden, generator=g)
    valid = torch.ones(cells, dtype=torch.bool)
    return [t.to("cuda") for t in (computed.to(dtype), skipped.to(dtype), target.to(dtype),
                                   valid, valid)]


def time_dp(hidden: int, num_layers: int, num_reqs: int, backend: str) -> float:
    from triton.testing import do_bench

    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5).to("cuda", torch.bfloat16)
               for _ in range(num_layers)]
    x0 = torch.randn(num_reqs, hidden, generator=g).to("cuda", torch.bfloat16)

    def layer(i, states):
        return states + torch.tanh(states) @ weights[i].T

    select = lambda *a, **k: kernel.dp_select(*a, **k, backend=backend)  # noqa: E731
    saved, layer_dp.dp_select = layer_dp.dp_select, select
    try:
        # A whole DP takes tens of ms: a long `rep` so the median rests on ~50 runs.
        return 1000 * do_bench(lambda: layer_dp.clasp_dp(layer, x0, num_layers, num_layers // 2),
                               warmup=200, rep=3000)
    finally:
        layer_dp.dp_select = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table here (markdown)")
    parser.add_argument("--requests", type=int, default=4,
                        help="requests sharing one skip set in the DP rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_clasp_kernel.py needs a CUDA GPU: the kernel's CPU path is "
                 "Triton's interpreter, which is for tests")
    from triton.testing import do_bench

    lines = [f"CLaSp DP on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"triton {kernel.triton.__version__}; microseconds (median of do_bench)", "",
             "| model | hidden | layers | one step, bf16: Triton | torch | speedup | "
             f"whole DP ({args.requests} requests), Triton | torch | speedup |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, hidden, num_layers in SHAPES:
        # A step scores M cells, each row the concatenation of the requests' states.
        inputs = step_inputs(hidden * args.requests, num_layers // 2, torch.bfloat16)
        step = {b: 1000 * do_bench(lambda b=b: kernel.dp_select(*inputs, backend=b),
                                   warmup=50, rep=300) for b in ("triton", "torch")}
        dp = {b: time_dp(hidden, num_layers, args.requests, b) for b in ("triton", "torch")}
        lines.append(f"| {name} | {hidden} | {num_layers} | {step['triton']:.1f} | "
                     f"{step['torch']:.1f} | {step['torch'] / step['triton']:.2f}x | "
                     f"{dp['triton']:.0f} | {dp['torch']:.0f} | {dp['torch'] / dp['triton']:.2f}x |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
