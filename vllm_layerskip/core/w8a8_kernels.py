"""The kernels behind `"draft_weights": "w8a8"`: int8 weights (one symmetric
scale per output row) times activations rounded to 8 bits per token as each
pass runs.

Two kernels read the same stored copy (int8 values, a scale a row):
- "vnni": vLLM's own CPU int8 GEMM (`_C.int8_scaled_mm_with_quant`, its port
  of SGLang's CPU kernels), which quantizes each token itself and multiplies
  with AVX512-VNNI. vLLM calls it only on AMX CPUs, but it runs on any
  AVX512-VNNI CPU for bf16 activations (float16 aborts the process inside the
  kernel, float32 it refuses). On the 2-core AVX512-BF16 EPYC, Qwen2.5-Coder-
  1.5B's 112 linears took 46 / 40 / 40 / 49 / 75 / 125 ms at 1 / 2 / 4 / 8 /
  16 / 32 tokens, against FBGEMM's 49 / 49 / 50 / 53 / 81 / 150 and the int4
  copy's 41 / 47 / 66 / 133 / 272 / 514 (benchmarks/kernels/bench_draft_linears.py,
  benchmarks/results/2026-12-05/draft_pass_breakdown_20261205.md, which also
  notes a faster reading with nothing else in memory, not reached in an engine).
- "fbgemm": torch's dynamic int8 linear (`quantized.linear_dynamic`), for every
  other CPU and dtype.

`VLLM_LAYERSKIP_W8A8_KERNEL=fbgemm` forces the second (to compare them).
"""

from __future__ import annotations

import functools
import warnings

import torch

from vllm_layerskip.core import kernel_choice
from vllm_layerskip.core.cpu_dtype import VNNI_FLAG, cpu_flags
from vllm_layerskip.core.errors import LayerSkipConfigError

KERNELS = ("vnni", "fbgemm")
ENV = "VLLM_LAYERSKIP_W8A8_KERNEL"


def choose(dtype: torch.dtype, out_features: int, in_features: int) -> str:
    """"vnni" where vLLM's int8 kernel serves this weight and dtype, else "fbgemm"."""
    forced = kernel_choice.forced(ENV, KERNELS, "CPU and dtype")
    if forced == "fbgemm":
        return "fbgemm"
    # The kernel's tiles: 16 output rows, inputs in blocks of 32 (vLLM's own check).
    fits = dtype == torch.bfloat16 and out_features % 16 == 0 and in_features % 32 == 0
    if fits and vnni_kernel_available():
        return "vnni"
    if forced == "vnni":
        raise LayerSkipConfigError(
            f"{ENV}=vnni: vLLM's int8 kernel needs an AVX512-VNNI CPU, bf16 and weights of "
            f"16 x 32 tiles; here dtype {dtype}, weight {out_features} x {in_features}, "
            f"kernel {'found' if vnni_kernel_available() else 'not found'}. Unset {ENV}.")
    _check_fbgemm()
    return "fbgemm"


def prepack(kernel: str, q: torch.Tensor, scale: torch.Tensor):
    """The packed weight a kernel reads, from int8 q [n, k] and scale [n]."""
    if kernel == "vnni":
        return torch.ops._C.convert_weight_packed(q.contiguous()), scale.float()
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "fbgemm"
        with warnings.catch_warnings():  # torch deprecates quantized tensors; 0.32's torch has them
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
            return torch.ops.quantized.linear_prepack(qweight, None), None
    finally:
        torch.backends.quantized.engine = previous


def matmul(kernel: str, x: torch.Tensor, packed, scale, dtype: torch.dtype) -> torch.Tensor:
    """x [T, k] times the packed weight, in `dtype`."""
    if kernel == "vnni":
        return torch.ops._C.int8_scaled_mm_with_quant(x.contiguous(), packed, scale, None,
                                                      dtype, True)
    # FBGEMM quantizes its input with one range for the whole tensor; dividing
    # each token by its own largest magnitude first makes that range each
    # token's (on Qwen2.5-Coder-1.5B's layer 5 and 8 tokens with outlier
    # channels, output error 4-8% of its norm against 5-13%).
    x = x.float()
    peak = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    out = torch.ops.quantized.linear_dynamic(x / peak, packed, not _has_vnni()) * peak
    return out.to(dtype)


@functools.cache
def vnni_kernel_available() -> bool:
    """Whether this CPU and vLLM build have the "vnni" kernel."""
    if VNNI_FLAG not in (cpu_flags() or set()):
        return False
    try:
        import vllm._custom_ops  # noqa: F401  (loads vLLM's CPU ops)
    except ImportError:
        return False
    return hasattr(torch.ops._C, "int8_scaled_mm_with_quant") and \
        hasattr(torch.ops._C, "convert_weight_packed")


def quantized_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def _check_fbgemm() -> None:
    engines = quantized_engines()
    if "fbgemm" not in engines:
        raise LayerSkipConfigError(
            f"'draft_weights': \"w8a8\" needs torch's FBGEMM int8 kernels (x86 CPUs); this "
            f"torch has only {', '.join(engines)}. Use \"int4\".")


@functools.cache
def _has_vnni() -> bool:
    """Whether FBGEMM may use the full 8-bit activation range: without VNNI its
    kernels add pairs of u8 x s8 products in int16, which saturates unless the
    activations keep to 7 bits (reduce_range). A saturated sum only makes a
    draft worse, never the output (verification reads the model's weights)."""
    flags = cpu_flags() or set()
    return "avx512_vnni" in flags or "avx_vnni" in flags
