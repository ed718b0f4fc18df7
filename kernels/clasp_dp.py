"""CLaSp's dynamic-programming step (paper, Algorithm 1 / Eq. 2) as one Triton kernel.

For layer step i and every skipped count j there are two candidate hidden states:
  computed[j] = layer_{i-1}(g(i-1, j))   (run layer i-1)
  skipped[j]  = g(i-1, j-1)              (skip layer i-1)
g(i, j) keeps whichever has the higher cosine similarity to the full model's
hidden state x_i (`target`). One call scores all j at once, since the j are
independent given row i-1 (paper, Sec. 3.6).

Rules shared by both backends:
  * cosines in float32 whatever the input dtype;
  * cos(a, t) = a.t / (max(|a|, EPS) * max(|t|, EPS)), EPS = 1e-6, so an all-zero
    row scores 0 instead of NaN;
  * an invalid candidate (j = 0 has no "skipped", j > i no reachable state) never
    wins; if neither is valid: took_skip = False, score = -inf, row = computed row;
  * ties go to "computed" (skipping must be strictly better);
  * new_states has the input dtype and holds bit-exact copies of the chosen rows.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch reference still works
    triton = None

EPS = 1e-6


def _cosine(rows: Tensor, target: Tensor) -> Tensor:
    rows, target = rows.float(), target.float()
    norms = rows.norm(dim=-1).clamp_min(EPS) * target.norm().clamp_min(EPS)
    return (rows @ target) / norms


def dp_select_torch(computed: Tensor, skipped: Tensor, target: Tensor,
                    computed_valid: Tensor, skipped_valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: computed, skipped [J, H]; target [H]; *_valid bool [J].
    Returns (new_states [J, H] input dtype, took_skip bool [J], best_score float32 [J])."""
    neg_inf = torch.tensor(float("-inf"), device=target.device)
    cos_c = torch.where(computed_valid, _cosine(computed, target), neg_inf)
    cos_s = torch.where(skipped_valid, _cosine(skipped, target), neg_inf)
    # Strict '>' sends ties to "computed"; invalid rows sit at -inf, so they never win
    # (and -inf > -inf is False, so "neither valid" keeps the computed row).
    took_skip = skipped_valid & (cos_s > cos_c)
    new_states = torch.where(took_skip[:, None], skipped, computed)
    return new_states, took_skip, torch.maximum(cos_c, cos_s)


if triton is not None:

    @triton.jit
    def _dp_select_kernel(computed_ptr, skipped_ptr, target_ptr, c_valid_ptr, s_valid_ptr,
                          out_ptr, took_skip_ptr, score_ptr,
                          H, stride_c, stride_s, stride_out, EPS: tl.constexpr, BLOCK_H: tl.constexpr):
        # One program per j. The target norm is recomputed by every program: it costs
        # one extra read of an H-vector and saves a second launch.
        j = tl.program_id(0).to(tl.int64)
        c_row = computed_ptr + j * stride_c
        s_row = skipped_ptr + j * stride_s

        # Pass 1: dot products and squared norms, elementwise partial sums in fp32.
        dot_c = tl.zeros([BLOCK_H], dtype=tl.float32)
        dot_s = tl.zeros([BLOCK_H], dtype=tl.float32)
        sq_c = tl.zeros([BLOCK_H], dtype=tl.float32)
        sq_s = tl.zeros([BLOCK_H], dtype=tl.float32)
        sq_t = tl.zeros([BLOCK_H], dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            mask = offs < H  # H need not be a multiple of BLOCK_H
            c = tl.load(c_row + offs, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32)
            t = tl.load(target_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dot_c += c * t
            dot_s += s * t
            sq_c += c * c
            sq_s += s * s
            sq_t += t * t
        # IEEE-rounded sqrt and division: tl.sqrt and '/' are approximate on NVIDIA
        # GPUs, and where two different rows have the same exact cosine (H = 1:
        # every cosine is +-1) they broke the tie both ways on an H100, against
        # the reference's "ties go to computed". Two per program: free.
        norm_t = tl.maximum(tl.sqrt_rn(tl.sum(sq_t, axis=0)), EPS)
        norm_c = tl.maximum(tl.sqrt_rn(tl.sum(sq_c, axis=0)), EPS)
        norm_s = tl.maximum(tl.sqrt_rn(tl.sum(sq_s, axis=0)), EPS)
        cos_c = tl.div_rn(tl.sum(dot_c, axis=0), norm_c * norm_t)
        cos_s = tl.div_rn(tl.sum(dot_s, axis=0), norm_s * norm_t)

        # Choice, same rules as dp_select_torch: invalid -> -inf, ties -> computed.
        c_ok = tl.load(c_valid_ptr + j) != 0
        s_ok = tl.load(s_valid_ptr + j) != 0
        cos_c = tl.where(c_ok, cos_c, float("-inf"))
        cos_s = tl.where(s_ok, cos_s, float("-inf"))
        take_skip = s_ok & (cos_s > cos_c)
        tl.store(took_skip_ptr + j, take_skip.to(tl.uint8))
        tl.store(score_ptr + j, tl.maximum(cos_c, cos_s))

        # Pass 2: copy the winning row in its own dtype (bit-exact). Selecting the row
        # pointer, rather than loading both rows, reads only the winner.
        src_row = tl.where(take_skip, s_row, c_row)
        out_row = out_ptr + j * stride_out
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            mask = offs < H
            tl.store(out_row + offs, tl.load(src_row + offs, mask=mask), mask=mask)


def _interpret_env() -> bool:
    # Same spellings Triton accepts. Triton itself reads the variable when a function
    # is decorated with @triton.jit, its own tl.sum/tl.zeros included, i.e. at
    # `import triton`: setting it later leaves a half-interpreted mix that fails.
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def dp_select_triton(computed: Tensor, skipped: Tensor, target: Tensor,
                     computed_valid: Tensor, skipped_valid: Tensor,
                     *, block_h: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Same contract as dp_select_torch, in one kernel launch. CPU tensors need
    Triton's interpreter: TRITON_INTERPRET=1 set before triton is first imported."""
    if triton is None:
        raise RuntimeError("dp_select_triton needs triton; use dp_select_torch")
    if not computed.is_cuda and not _interpret_env():
        raise RuntimeError("dp_select_triton on CPU tensors needs TRITON_INTERPRET=1 "
                           "(set before triton is imported); or use dp_select_torch")
    J, H = computed.shape
    assert skipped.shape == (J, H) and target.shape == (H,), (computed.shape, skipped.shape, target.shape)
    assert computed.dtype == skipped.dtype, (computed.dtype, skipped.dtype)
    assert computed_valid.shape == skipped_valid.shape == (J,)
    # Rows may be strided (e.g. slices of the DP table); elements must be contiguous.
    computed, skipped = (x if x.stride(-1) == 1 else x.contiguous() for x in (computed, skipped))
    target = target.contiguous()

    out = torch.empty((J, H), dtype=computed.dtype, device=computed.device)
    took_skip = torch.empty(J, dtype=torch.uint8, device=computed.device)
    score = torch.empty(J, dtype=torch.float32, device=computed.device)
    if J == 0:
        return out, took_skip.bool(), score
    # Bool tensors go in and out as uint8 views: same bytes, no i1 pointer quirks.
    c_valid = computed_valid.to(torch.bool).contiguous().view(torch.uint8)
    s_valid = skipped_valid.to(torch.bool).contiguous().view(torch.uint8)
    if block_h is None:
        block_h = min(max(triton.next_power_of_2(H), 16), 1024)

    _dp_select_kernel[(J,)](computed, skipped, target, c_valid, s_valid, out, took_skip, score,
                            H, computed.stride(0), skipped.stride(0), out.stride(0), EPS=EPS, BLOCK_H=block_h)
    return out, took_skip.view(torch.bool), score


def dp_select(computed: Tensor, skipped: Tensor, target: Tensor,
              computed_valid: Tensor, skipped_valid: Tensor,
              backend: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Triton on CUDA tensors (or anywhere under TRITON_INTERPRET=1), torch otherwise.
    backend="torch" / "triton" overrides the choice."""
    if backend is None:
        backend = "triton" if triton is not None and (computed.is_cuda or _interpret_env()) else "torch"
    if backend == "triton":
        return dp_select_triton(computed, skipped, target, computed_valid, skipped_valid)
    if backend == "torch":
        return dp_select_torch(computed, skipped, target, computed_valid, skipped_valid)
    raise ValueError(f"backend must be 'torch', 'triton' or None, not {backend!r}")
