"""Whether a bf16 model on this CPU can gain from speculation at all.

On an x86 CPU without bf16 arithmetic (no AVX512-BF16, no AMX) vLLM's CPU GEMM falls
back to torch's linear for bf16, and every row a step adds costs nearly a whole row's
compute: verifying 4 tokens of Qwen2.5-Coder-1.5B cost 3.00 decode steps on a 2-core
AVX2 EPYC, so no draft can pay and the cost model keeps drafting off. float32 goes
through oneDNN there and is memory-bound: 4 tokens cost 1.37 steps
(benchmarks/results/2026-11-27/step_cost_float32_20261127.md). A user who sees no
speedup in bf16 on such a CPU should be told at start-up, not left to benchmark it.
"""

from __future__ import annotations

BF16_ARITHMETIC_FLAGS = ("avx512_bf16", "amx_bf16")
# What vLLM's int8 kernel for w8a8 draft weights needs (core/w8a8_kernels.py).
VNNI_FLAG = "avx512_vnni"


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The first CPU's x86 feature flags, or None where there is no such line
    (another architecture, or no /proc)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def bf16_without_arithmetic_warning(dtype: str, flags: set[str] | None) -> str | None:
    """The start-up warning for a bf16 model on an x86 CPU without bf16 arithmetic;
    None anywhere else (other dtypes, CPUs with bf16 arithmetic, non-x86, unknown)."""
    if dtype != "bfloat16" or not flags or "avx2" not in flags:
        return None
    if any(flag in flags for flag in BF16_ARITHMETIC_FLAGS):
        return None
    return (
        "bfloat16 on a CPU without bf16 arithmetic (no AVX512-BF16 or AMX): each token a "
        "step verifies costs nearly a whole decode step here (verifying 4 tokens of "
        "Qwen2.5-Coder-1.5B cost 3.0 steps on a 2-core AVX2 CPU), so drafting cannot pay "
        "and the cost model will keep it off. float32 is memory-bound on such CPUs (4 "
        "tokens: 1.37 steps) and speculation pays there where drafts are accepted (coding "
        "1.6x), though plain float32 decoded 1.2x slower than plain bfloat16: try "
        "--dtype float32 and compare (docs/limits.md)."
    )
