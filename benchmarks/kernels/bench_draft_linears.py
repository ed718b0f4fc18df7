"""One pass through a model's linear layers per draft_weights kernel, at 1-32
tokens: torch's bf16 linear (oneDNN) and the draft copies of core/draft_weights.py
as draft passes call them, "int4" with each of its kernels (core/int4_kernels.py:
the project's VNNI kernel where this CPU has it, and torch's weight-only kernel) and
"w8a8" with each of its kernels (core/w8a8_kernels.py: vLLM's VNNI int8 GEMM where
this CPU has it, and FBGEMM's dynamic int8 linear). Every layer has its own random weights
(28 layers x qkv, o, gate_up, down by default: Qwen2.5-Coder-1.5B's shapes), so
a pass reads them from memory, as a draft pass does, not from the caches.
Milliseconds for the whole pass; the figures in core/draft_weights.py and
docs/draft-weights.md. About 3 minutes and 6 GB.

    .venv/bin/python benchmarks/kernels/bench_draft_linears.py
"""

from __future__ import annotations

import argparse
import os
import time
import warnings


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--qkv", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8960)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # torch deprecates its quantized tensors
    from vllm_layerskip.core import int4_kernels, w8a8_kernels
    from vllm_layerskip.core.draft_weights import QuantizedLinear

    h = args.hidden
    shapes = [(args.qkv, h), (h, h), (2 * args.intermediate, h), (h, args.intermediate)] * args.layers
    w8a8 = [k for k in w8a8_kernels.KERNELS
            if k == "fbgemm" or w8a8_kernels.vnni_kernel_available()]
    int4 = [k for k in int4_kernels.KERNELS if k == "torch" or int4_kernels.library()]
    bf16, copies = [], {**{f"int4 {k}": [] for k in int4}, **{f"w8a8 {k}": [] for k in w8a8}}
    env = {"int4": int4_kernels.ENV, "w8a8": w8a8_kernels.ENV}
    for n, k in shapes:
        layer = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        torch.nn.init.normal_(layer.weight, std=0.02)
        bf16.append(layer.weight.detach())
        for column, made in copies.items():  # the copies draft passes read, made as they are
            scheme, _, kernel = column.partition(" ")
            os.environ[env[scheme]] = kernel
            made.append(QuantizedLinear(layer, scheme))
            os.environ.pop(env[scheme])

    def inputs(m):
        return {k: torch.randn(m, k, dtype=torch.bfloat16) for k in {k for _, k in shapes}}

    def run_bf16(m):
        x = inputs(m)
        for w in bf16:
            torch.nn.functional.linear(x[w.shape[1]], w)

    def run_copies(scheme):
        def run(m):
            x = inputs(m)
            for copy in copies[scheme]:
                copy.matmul(x[copy.in_features])
        return run

    runs = {"bf16 (oneDNN)": run_bf16, **{column: run_copies(column) for column in copies}}

    def ms(run, m):
        run(m)
        start = time.perf_counter()
        for _ in range(args.repeats):
            run(m)
        return 1000 * (time.perf_counter() - start) / args.repeats

    bytes_a_pass = {column: sum(c.nbytes for c in made) / 1e9 for column, made in copies.items()}
    print(f"{len(shapes)} linear layers, {torch.get_num_threads()} threads; ms a pass; GB read: "
          f"bf16 {sum(w.nbytes for w in bf16) / 1e9:.2f}, "
          + ", ".join(f"{column} {gb:.2f}" for column, gb in bytes_a_pass.items()))
    print("| tokens | " + " | ".join(runs) + " |\n| ---: |" + " ---: |" * len(runs))
    for m in args.tokens:
        print(f"| {m} | " + " | ".join(f"{ms(run, m):.1f}" for run in runs.values()) + " |",
              flush=True)


if __name__ == "__main__":
    main()
