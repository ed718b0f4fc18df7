"""One pass through a model's linear layers per draft_weights kernel, at 1-32
tokens: torch's bf16 linear (oneDNN), the int4 weight-only kernel ("int4") and
FBGEMM's dynamic int8 linear ("w8a8"). Every layer has its own random weights
(28 layers x qkv, o, gate_up, down by default: Qwen2.5-Coder-1.5B's shapes), so
a pass reads them from memory, as a draft pass does, not from the caches.
Milliseconds for the whole pass; the figures in core/draft_weights.py and
docs/draft-weights.md. About 2 minutes and 4 GB.

    .venv/bin/python benchmarks/bench_draft_linears.py
"""

from __future__ import annotations

import argparse
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
    torch.backends.quantized.engine = "fbgemm"
    h = args.hidden
    shapes = [(args.qkv, h), (h, h), (2 * args.intermediate, h), (h, args.intermediate)] * args.layers
    bf16, int4, w8a8 = [], [], []
    for n, k in shapes:
        w = torch.randn(n, k) * 0.02
        bf16.append(w.bfloat16())
        q = torch.randint(0, 16, (n, k), dtype=torch.int32)
        int4.append((torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                     torch.randn(k // 32, n, 2).bfloat16()))
        scale = (w.abs().amax(1) / 127).double()
        qw = torch.quantize_per_channel(w, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        w8a8.append(torch.ops.quantized.linear_prepack(qw, None))

    def inputs(m, dtype):
        return {k: torch.randn(m, k).to(dtype) for k in {k for _, k in shapes}}

    def run_bf16(m):
        x = inputs(m, torch.bfloat16)
        for w in bf16:
            torch.nn.functional.linear(x[w.shape[1]], w)

    def run_int4(m):
        x = inputs(m, torch.bfloat16)
        for (packed, scales), (_, k) in zip(int4, shapes):
            torch.ops.aten._weight_int4pack_mm_for_cpu(x[k], packed, 32, scales)

    def run_w8a8(m):
        x = inputs(m, torch.float32)
        for packed, (_, k) in zip(w8a8, shapes):
            torch.ops.quantized.linear_dynamic(x[k], packed, False)

    def ms(run, m):
        run(m)
        start = time.perf_counter()
        for _ in range(args.repeats):
            run(m)
        return 1000 * (time.perf_counter() - start) / args.repeats

    print(f"{len(shapes)} linear layers, {torch.get_num_threads()} threads; ms a pass")
    print("| tokens | bf16 (oneDNN) | int4 | w8a8 (FBGEMM) |\n| ---: | ---: | ---: | ---: |")
    for m in args.tokens:
        print(f"| {m} | {ms(run_bf16, m):.1f} | {ms(run_int4, m):.1f} | {ms(run_w8a8, m):.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
