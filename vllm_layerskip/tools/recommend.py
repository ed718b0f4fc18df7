"""`vllm-layerskip recommend --model M [--dtype D] [--max-concurrency N]`: the
speculative config this project recommends for a model on this machine, with
one line on each reason above it. The demo and README's "which method" advice
read the same rule (`recommend()`), so the three cannot drift apart.

The rule, from what was measured (benchmarks/RESULTS.md):
- On a CPU with bf16 arithmetic (AVX512-BF16 or AMX), a bf16 model drafts
  through every layer on a quantized copy of its weights: int4 while at most 4
  requests are in flight (a pass of up to 4 tokens), w8a8 above (it reads its
  copy once for a pass of any size). With AVX512-VNNI and a C compiler int4
  runs the project's kernel (core/int4_kernels.py), a one-token pass at about
  two thirds of w8a8's cost; without a compiler, w8a8 at any load (vLLM's int8
  kernel drafts a token as fast as torch's int4 one: Qwen2.5-Coder-1.5B, batch 1,
  1.64x against int4's 1.46x, benchmarks/results/2026-12-05/bench_20261205-142403.md).
- Without bf16 arithmetic a bf16 step is compute-bound and no draft pays: the
  advice is float32, where a step is memory-bound again.
- float32, and any GPU (the quantized copies are CPU kernels): the model's own
  weights with a skip set, `self_sd` where a profile ships for the model (its
  set was searched offline), else `swift` (learns one while serving).
K = 8 with the cost model on: long copies where text repeats, short drafts or
none where nothing pays.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from vllm_layerskip.core import int4_kernels
from vllm_layerskip.core.cpu_dtype import BF16_ARITHMETIC_FLAGS, VNNI_FLAG, cpu_flags

NUM_SPECULATIVE_TOKENS = 8
# Requests in flight above which a quantized draft pass runs w8a8 rather than
# int4 (core/draft_weights.py MAX_TOKENS: int4 serves passes of up to 4 tokens).
INT4_MAX_CONCURRENCY = 4


@dataclass
class Recommendation:
    spec: dict
    reasons: list[str] = field(default_factory=list)
    dtype: str = "bfloat16"


def _shipped_profile(model: str | None) -> bool:
    """Whether a self_sd profile ships for the checkpoint at `model`."""
    if not model or not os.path.isdir(model):
        return False
    from vllm_layerskip.core.errors import LayerSkipConfigError
    from vllm_layerskip.core.identity import checkpoint_identity
    from vllm_layerskip.methods.self_sd.profile import load_profile

    try:
        load_profile("shipped", checkpoint_identity(model))
    except (LayerSkipConfigError, OSError, ValueError, KeyError):
        return False
    return True


def _checkpoint_dtype(model: str | None) -> str | None:
    try:
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
    except (OSError, TypeError, ValueError):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if dtype in ("bfloat16", "float16", "float32") else None


def _on_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def recommend(model: str | None = None, dtype: str | None = None, max_concurrency: int = 1,
              flags: set[str] | None = None, gpu: bool | None = None,
              has_profile: bool | None = None, int4_kernel: bool | None = None) -> Recommendation:
    """The recommended speculative config for `model` (a checkpoint directory,
    or None) served in `dtype` (None: the checkpoint's own) with up to
    `max_concurrency` requests in flight. `flags`, `gpu`, `has_profile`,
    `int4_kernel` (the project's int4 kernel runs here): what this machine and
    the model have (None: looked up)."""
    gpu = _on_gpu() if gpu is None else gpu
    flags = cpu_flags() if flags is None and not gpu else flags
    has_profile = _shipped_profile(model) if has_profile is None else has_profile
    reasons = []
    given = dtype
    dtype = dtype or _checkpoint_dtype(model) or "bfloat16"
    if given is None:
        reasons.append(f"dtype {dtype}: the checkpoint's own (pass --dtype to choose)")
    bf16_arithmetic = bool(flags) and any(f in flags for f in BF16_ARITHMETIC_FLAGS)
    if not gpu and dtype == "bfloat16" and flags and not bf16_arithmetic:
        dtype = "float32"
        reasons.append("this CPU has no bf16 arithmetic (AVX512-BF16 or AMX): a bf16 step "
                       "verifying 4 tokens costs ~3 decode steps, so no draft pays; in "
                       "float32 a step is memory-bound: serve with --dtype float32")
    spec = {"num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    if not gpu and dtype == "bfloat16":
        vnni = VNNI_FLAG in flags
        int4_kernel = int4_kernels.can_run(flags) if int4_kernel is None else int4_kernel
        many = max_concurrency > INT4_MAX_CONCURRENCY
        scheme = "w8a8" if many or (vnni and not int4_kernel) else "int4"
        spec = {"method": "quantized", **spec, "draft_weights": scheme}
        reasons.append("CPU with bf16 arithmetic, bf16: every layer drafts, reading a "
                       "quantized copy of its weights (no skip set; the model's own weights "
                       "verify)")
        if scheme == "int4" and int4_kernel:
            why = (f"{max_concurrency} request(s) in flight, AVX512-VNNI: the project's int4 "
                   "kernel drafts a token at about two thirds of w8a8's cost (passes of up to "
                   "4 tokens)")
        elif scheme == "int4":
            why = f"{max_concurrency} request(s) in flight (int4 pays for passes of up to 4 tokens)"
        elif not many:
            why = ("AVX512-VNNI without a C compiler for the project's int4 kernel: vLLM's int8 "
                   "kernel drafts a token as fast as torch's int4 one (install gcc for int4)")
        else:
            why = (f"{max_concurrency} request(s) in flight (over {INT4_MAX_CONCURRENCY}: w8a8 "
                   "reads its weights once for a whole pass)")
        reasons.append(f"draft_weights {scheme}: {why}")
    else:
        where = "a GPU" if gpu else f"{dtype} on a CPU"
        if has_profile:
            spec = {"method": "self_sd", "profile": "shipped", **spec}
            reasons.append(f"{where}: the model's own weights with a skip set; a self_sd "
                           "profile ships for this model (a set searched offline)")
        else:
            spec = {"method": "swift", **spec}
            reasons.append(f"{where}: the model's own weights with a skip set; no self_sd "
                           "profile ships for this model, swift learns a set while serving")
    reasons.append(f"K = {NUM_SPECULATIVE_TOKENS}, cost model on: long copies where the "
                   "text repeats, short drafts or none where nothing pays")
    return Recommendation(spec=spec, reasons=reasons, dtype=dtype)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="a known model name (prepare-model's) or a checkpoint directory")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="the dtype you serve in (default: the checkpoint's)")
    parser.add_argument("--max-concurrency", type=int, default=1,
                        help="requests you expect in flight at once (default 1)")


def run_recommend(args) -> int:
    if args.max_concurrency < 1:
        raise SystemExit(f"--max-concurrency must be 1 or more, got {args.max_concurrency}")
    model = args.model
    from vllm_layerskip.tools.prepare_model import CATALOG, ensure_model

    if model in CATALOG:
        model = ensure_model(model)
    elif model is not None and not os.path.isdir(model):
        raise SystemExit(f"--model {model!r} is neither a known model ({', '.join(CATALOG)}) "
                         "nor a checkpoint directory")
    result = recommend(model, args.dtype, args.max_concurrency)
    for reason in result.reasons:
        print(f"# {reason}")
    if args.dtype is None or result.dtype != args.dtype:
        print(f"# serve with --dtype {result.dtype}")
    print(json.dumps(result.spec))
    return 0
