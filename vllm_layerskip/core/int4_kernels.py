"""The kernels behind `"draft_weights": "int4"`: the same stored copy (4-bit
values, a step and a zero per 32 weights of a row) read by one of two kernels.

- "vnni": the project's own (core/int4_vnni.c), built with the C compiler on
  first use and kept beside the draft-weight copies: activations rounded to
  8 bits per 32 columns as each pass runs, multiplied with AVX512-VNNI integer
  dot products. Qwen2.5-Coder-1.5B's 112 linears at 1 / 2 / 4 tokens took
  34 / 40 / 62 ms against torch's 54 / 62 / 79 ms on the 2-core AVX512 Xeon
  (benchmarks/kernels/bench_draft_linears.py; results/2026-12-07/draft_linears_20261207.md).
  Its drafts are a little less exact: ~0.65% of a linear's output norm on
  top of the weights' rounding, against ~0.17% for torch's kernel.
- "torch": torch's `_weight_int4pack_mm_for_cpu`, for float32, other CPUs and
  shapes, or where no compiler is found.

`VLLM_LAYERSKIP_INT4_KERNEL=torch` forces the second (to compare them).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from vllm_layerskip.core import draft_weights_cache, kernel_choice
from vllm_layerskip.core.cpu_dtype import VNNI_FLAG, cpu_flags
from vllm_layerskip.core.errors import LayerSkipConfigError

logger = logging.getLogger(__name__)

KERNELS = ("vnni", "torch")
ENV = "VLLM_LAYERSKIP_INT4_KERNEL"
SOURCE = Path(__file__).with_name("int4_vnni.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-fopenmp",
         "-shared", "-fPIC")
NEEDS = ("avx512f", "avx512bw", "avx512vl", VNNI_FLAG)  # what FLAGS let the compiler use
ROWS, COLS, MAX_PASS = 4, 128, 4  # the kernel's tile and the tokens of one call


def choose(dtype: torch.dtype, out_features: int, in_features: int) -> str:
    """"vnni" where the project's kernel serves this weight on this CPU, else "torch"."""
    forced = kernel_choice.forced(ENV, KERNELS, "CPU and shape")
    if forced == "torch":
        return "torch"
    # bf16 only: it keeps steps and zeros in bf16 and rounds its output to bf16,
    # as torch's kernel does for bf16 weights (for float32 ones torch keeps float32).
    fits = dtype == torch.bfloat16 and out_features % ROWS == 0 and in_features % COLS == 0
    if fits and library() is not None:
        return "vnni"
    if forced == "vnni":
        raise LayerSkipConfigError(
            f"{ENV}=vnni: the kernel needs a CPU with {', '.join(NEEDS)}, a C compiler "
            f"(gcc, or $CC), bf16 and weights of {ROWS} x {COLS} tiles; here dtype {dtype}, "
            f"weight {out_features} x {in_features}, kernel {'built' if library() else 'not built'} "
            f"(the log says why). Unset {ENV}.")
    return "torch"


def tile(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored copy (core/draft_weights._quantize_int4: q [n, k / 2], scales
    [k / 32, n, 2] of (step, zero), w = (q - 8) * step + zero) in the kernel's
    layout: weights [n / 4, k / 128, 4, 64] bytes, steps and zeros [n / 4, k / 128,
    2, 4, 4] bf16."""
    n, half = q.shape
    k = 2 * half
    weights = q.view(n // ROWS, ROWS, k // COLS, 64).permute(0, 2, 1, 3).contiguous()
    per_tile = scales.to(torch.bfloat16).permute(2, 1, 0).reshape(2, n // ROWS, ROWS, k // COLS, 4)
    return weights, per_tile.permute(1, 3, 0, 2, 4).contiguous()


def matmul(x: torch.Tensor, weights: torch.Tensor, steps_zeros: torch.Tensor, out_features: int,
           bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, k] bf16 times the tiled weight, plus bias (bf16): [T, out_features] bf16."""
    lib = library()
    x = x.contiguous()
    tokens, k = x.shape
    out = torch.empty(tokens, out_features, dtype=torch.bfloat16)
    for start in range(0, tokens, MAX_PASS):
        count = min(MAX_PASS, tokens - start)
        rc = lib.int4_vnni_mm(weights.data_ptr(), steps_zeros.data_ptr(), x[start].data_ptr(),
                              count, out_features, k, None if bias is None else bias.data_ptr(),
                              out[start].data_ptr())
        if rc != 0:
            raise RuntimeError(f"int4 kernel: error {rc} for {count} x {k} times "
                               f"{out_features} x {k} (-1: shape, -2: memory)")
    return out


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel, or None (with one log line saying why) where this CPU
    lacks the instructions or it cannot be built."""
    flags = cpu_flags() or set()
    missing = [f for f in NEEDS if f not in flags]
    if missing:
        logger.info("int4 draft weights: torch's kernel (this CPU lacks %s)", ", ".join(missing))
        return None
    try:
        lib = ctypes.CDLL(str(_built()))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", b"") or b""
        logger.warning("int4 draft weights: could not build core/int4_vnni.c (%s%s); torch's "
                       "slower kernel runs instead. Install gcc, or set CC.", e,
                       ": " + detail.decode(errors="replace")[-300:] if detail else "")
        return None
    lib.int4_vnni_mm.restype = ctypes.c_int
    lib.int4_vnni_mm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def compiler() -> str | None:
    """The C compiler that builds the kernel ($CC, else gcc), None where there is none."""
    return shutil.which(os.environ.get("CC", "gcc"))


def can_run(flags: set[str] | None) -> bool:
    """Whether a CPU with these flags runs the kernel, a compiler being here to build it."""
    return bool(flags) and all(f in flags for f in NEEDS) and compiler() is not None


def _built() -> Path:
    """The shared library of SOURCE, built once per source and flags (~0.5 s) in
    the draft-weight cache's folder (a temporary one where that is off)."""
    source = SOURCE.read_bytes()
    cc = os.environ.get("CC", "gcc")
    digest = hashlib.sha256(source + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    cache = draft_weights_cache.folder()
    folder = (cache.parent if cache else Path(tempfile.gettempdir()) / "vllm_layerskip") / "kernels"
    path = folder / f"int4_vnni-{digest}.so"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        partial = Path(scratch) / path.name
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(partial)], check=True,
                       capture_output=True, timeout=120)
        os.replace(partial, path)  # whole or absent, for a process building beside this one
    return path
