"""The int4 draft weights' kernels (core/int4_kernels.py, core/int4_vnni.c):
what the project's VNNI kernel computes against the copy it reads and against
torch's kernel, which weights and CPUs get it, and the override's errors."""

import pytest
import torch
from torch import nn

from vllm_layerskip.core import int4_kernels
from vllm_layerskip.core.draft_weights import QuantizedLinear, _quantize_int4
from vllm_layerskip.core.errors import LayerSkipConfigError

needs_kernel = pytest.mark.skipif(
    int4_kernels.library() is None,
    reason="this CPU lacks AVX512-VNNI or no C compiler built core/int4_vnni.c")


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch):
    from vllm_layerskip.core import draft_weights_cache

    monkeypatch.setenv(draft_weights_cache.DISABLE_ENV, "0")


def layer_of(out_features, in_features, dtype, bias):
    torch.manual_seed(out_features + in_features)
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=dtype) * 0.05,
                                requires_grad=False)
    layer.bias = nn.Parameter(torch.randn(out_features, dtype=dtype), requires_grad=False) \
        if bias else None
    return layer


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The int4 copy's own weights, as floats: what both kernels approximate."""
    stored = _quantize_int4(weight, "minmax")
    q, scales = stored["q"], stored["scales"]
    n, k = weight.shape
    values = torch.empty(n, k)
    values[:, 0::2], values[:, 1::2] = (q & 15).float(), (q >> 4).float()
    step, zero = scales[:, :, 0].t().float(), scales[:, :, 1].t().float()
    return ((values.view(n, k // 32, 32) - 8) * step[..., None] + zero[..., None]).view(n, k)


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@needs_kernel
@pytest.mark.parametrize("tokens", [1, 3, 4, 6])
@pytest.mark.parametrize("bias", [True, False])
def test_vnni_kernel_computes_the_int4_copy_with_8_bit_activations(monkeypatch, tokens, bias):
    dtype = torch.bfloat16
    layer = layer_of(96, 384, dtype, bias)
    x = torch.randn(tokens, 384, dtype=dtype)
    monkeypatch.setenv(int4_kernels.ENV, "vnni")
    copy = QuantizedLinear(layer, "int4", "minmax")
    assert copy.kernel == "vnni"
    out, _ = copy(x)
    want = x.float() @ dequantized(layer.weight).t()
    if bias:
        want = want + layer.bias.float()
    assert out.dtype == dtype and out.shape == (tokens, 96)
    # Rounding x to 8 bits per 32 columns costs ~0.7% of the output's norm (bf16
    # output rounding ~0.3%); a wrong tile, token or group order costs ~140%.
    assert relative_error(out, want) < 0.015
    monkeypatch.setenv(int4_kernels.ENV, "torch")
    reference, _ = QuantizedLinear(layer, "int4", "minmax")(x)
    assert relative_error(out, reference) < 0.015


@needs_kernel
def test_each_token_is_rounded_on_its_own_ranges(monkeypatch):
    """A token a thousand times larger beside a small one must not take the
    small one's precision: each token and group has its own scale."""
    layer = layer_of(64, 256, torch.bfloat16, False)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    x[0] *= 1000
    monkeypatch.setenv(int4_kernels.ENV, "vnni")
    out, _ = QuantizedLinear(layer, "int4", "minmax")(x)
    want = x.float() @ dequantized(layer.weight).t()
    assert relative_error(out[1], want[1]) < 0.015


def test_weights_off_the_kernels_tiles_float32_and_the_override_go_to_torchs_kernel(monkeypatch):
    monkeypatch.delenv(int4_kernels.ENV, raising=False)
    layer = layer_of(96, 96, torch.bfloat16, False)  # 96 columns: not 128-column chunks
    assert QuantizedLinear(layer, "int4").kernel == "torch"
    # float32 weights keep torch's kernel, which keeps their steps in float32
    assert QuantizedLinear(layer_of(96, 384, torch.float32, False), "int4").kernel == "torch"
    monkeypatch.setenv(int4_kernels.ENV, "torch")
    copy = QuantizedLinear(layer_of(96, 384, torch.bfloat16, False), "int4")
    assert copy.kernel == "torch"
    assert copy.packed.dtype != torch.uint8 or copy.packed.dim() != 4  # torch's packing


def test_the_override_is_checked(monkeypatch):
    monkeypatch.setenv(int4_kernels.ENV, "fast")
    with pytest.raises(LayerSkipConfigError, match=r"VLLM_LAYERSKIP_INT4_KERNEL='fast': must be "
                                                   r"one of vnni, torch"):
        int4_kernels.choose(torch.bfloat16, 96, 384)
    monkeypatch.setenv(int4_kernels.ENV, "vnni")
    with pytest.raises(LayerSkipConfigError, match=r"dtype torch.bfloat16, weight 96 x 96.*"
                                                   r"Unset VLLM_LAYERSKIP_INT4_KERNEL"):
        int4_kernels.choose(torch.bfloat16, 96, 96)


@needs_kernel
def test_the_vnni_kernel_is_picked_where_it_fits(monkeypatch):
    monkeypatch.delenv(int4_kernels.ENV, raising=False)
    copy = QuantizedLinear(layer_of(96, 384, torch.bfloat16, False), "int4")
    assert copy.kernel == "vnni"
    assert tuple(copy.packed.shape) == (24, 3, 4, 64)  # [n / 4, k / 128, 4 rows, 64 bytes]
    assert copy.nbytes == 96 * 384 // 2 + 96 * 384 // 32 * 4  # a step and a low a group


def test_a_cpu_without_vnni_gets_torchs_kernel(monkeypatch):
    monkeypatch.setattr(int4_kernels, "cpu_flags", lambda: {"avx512f", "avx512bw"})
    int4_kernels.library.cache_clear()
    try:
        assert int4_kernels.library() is None
        monkeypatch.delenv(int4_kernels.ENV, raising=False)
        assert int4_kernels.choose(torch.bfloat16, 96, 384) == "torch"
    finally:
        int4_kernels.library.cache_clear()


def test_without_a_compiler_torchs_kernel_runs_and_the_log_says_what_to_install(monkeypatch,
                                                                                caplog):
    monkeypatch.setattr(int4_kernels, "cpu_flags", lambda: set(int4_kernels.NEEDS))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.delenv(int4_kernels.ENV, raising=False)
    int4_kernels.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=int4_kernels.__name__):
            assert int4_kernels.library() is None
        assert "could not build core/int4_vnni.c" in caplog.text
        assert "Install gcc, or set CC" in caplog.text
        assert QuantizedLinear(layer_of(96, 384, torch.bfloat16, False), "int4").kernel == "torch"
    finally:
        int4_kernels.library.cache_clear()


def test_a_build_that_hangs_leaves_torchs_kernel_with_a_warning(monkeypatch, caplog):
    import subprocess

    monkeypatch.setattr(int4_kernels, "cpu_flags", lambda: set(int4_kernels.NEEDS))
    monkeypatch.setenv("CC", "gcc-that-hangs")  # a path of its own in the kernels folder

    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], 120)

    monkeypatch.setattr(int4_kernels.subprocess, "run", hangs)
    int4_kernels.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=int4_kernels.__name__):
            assert int4_kernels.library() is None
        assert "timed out after 120 seconds" in caplog.text
    finally:
        int4_kernels.library.cache_clear()
