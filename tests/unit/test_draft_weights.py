"""Quantized draft weights (core/draft_weights.py): what a quantized linear
computes, vLLM's bias and return conventions, when draft passes use the copies,
and the errors a user sees. The engine-level parity with draft weights on is
in tests/engine/test_parity_smollm2.py."""

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vllm_layerskip.core import draft_weights, w8a8_kernels
from vllm_layerskip.core.draft_weights import ATTR, QuantizedLinear, attach, draft_layers
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.model_adapter import DecoderStack
from vllm_layerskip.methods.layer_skip.options import LayerSkipOptions


def linear(out_features, in_features, bias=False, dtype=torch.float32, **attrs):
    torch.manual_seed(out_features * 7 + in_features)
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=dtype) * 0.05,
                                requires_grad=False)
    layer.bias = nn.Parameter(torch.randn(out_features, dtype=dtype), requires_grad=False) \
        if bias else None
    for key, value in attrs.items():
        setattr(layer, key, value)
    return layer


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch):
    """Copies made here are not kept in the user's cache (core/draft_weights_cache.py)."""
    from vllm_layerskip.core import draft_weights_cache

    monkeypatch.setenv(draft_weights_cache.DISABLE_ENV, "0")


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme,bound", [("int4", 0.12), ("int8", 0.01), ("w8a8", 0.03)])
def test_quantized_linear_approximates_the_layer(scheme, bound, dtype):
    layer = linear(96, 128, bias=True, dtype=dtype)
    x = torch.randn(3, 128, dtype=dtype)
    out, extra = QuantizedLinear(layer, scheme)(x)
    want = nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    assert extra is None and out.dtype == dtype and out.shape == (3, 96)
    error = relative_error(out, want)
    # int4 (16 levels a group of 32) is a coarse copy, int8 a close one, w8a8
    # rounds the input too; all far from an unrelated output (relative error ~1.4).
    assert error < bound, error
    assert error > 1e-4, "a quantized copy that equals the layer exactly: is it quantized?"


def test_int4_copy_is_a_quarter_of_the_bytes():
    layer = linear(256, 512, dtype=torch.bfloat16)
    copy = QuantizedLinear(layer, "int4")
    # 4 bits a weight, plus a bf16 scale and zero per 32 weights.
    assert copy.nbytes == 256 * 512 // 2 + 2 * 2 * 256 * 512 // 32


needs_vnni = pytest.mark.skipif(not w8a8_kernels.vnni_kernel_available(),
                                reason="vLLM's int8 kernel needs an AVX512-VNNI CPU")


@pytest.mark.parametrize("kernel", [pytest.param("vnni", marks=needs_vnni), "fbgemm"])
def test_w8a8_quantizes_each_token_on_its_own_range(monkeypatch, kernel):
    # One token 1000x larger than the others shares the pass: with one range for
    # the whole input (FBGEMM's own) the small tokens would round to ~nothing.
    monkeypatch.setenv(w8a8_kernels.ENV, kernel)
    layer = linear(64, 128, bias=True, dtype=torch.bfloat16)
    copy = QuantizedLinear(layer, "w8a8")
    assert copy.kernel == kernel
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    x[2] *= 1000
    want = nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    out, _ = copy(x)
    for row in range(4):
        assert relative_error(out[row], want[row]) < 0.03, row
    assert copy.nbytes == 64 * (128 + 16)


@needs_vnni
def test_w8a8_picks_vllms_int8_kernel_for_bf16_and_fbgemm_for_the_rest(monkeypatch):
    monkeypatch.delenv(w8a8_kernels.ENV, raising=False)
    assert QuantizedLinear(linear(64, 128, dtype=torch.bfloat16), "w8a8").kernel == "vnni"
    # float32 (the kernel refuses it) and rows that are not whole tiles of 16.
    assert QuantizedLinear(linear(64, 128), "w8a8").kernel == "fbgemm"
    assert QuantizedLinear(linear(72, 128, dtype=torch.bfloat16), "w8a8").kernel == "fbgemm"
    # The two kernels compute the same product up to their roundings.
    layer = linear(256, 512, dtype=torch.bfloat16)
    x = torch.randn(5, 512, dtype=torch.bfloat16)
    vnni = QuantizedLinear(layer, "w8a8").matmul(x)
    monkeypatch.setenv(w8a8_kernels.ENV, "fbgemm")
    assert relative_error(vnni, QuantizedLinear(layer, "w8a8").matmul(x)) < 0.02


def test_w8a8_kernel_override_is_checked(monkeypatch):
    monkeypatch.setenv(w8a8_kernels.ENV, "onednn")
    with pytest.raises(LayerSkipConfigError, match=r"VLLM_LAYERSKIP_W8A8_KERNEL='onednn': must "
                                                    r"be one of vnni, fbgemm \(or unset"):
        QuantizedLinear(linear(64, 128, dtype=torch.bfloat16), "w8a8")
    monkeypatch.setenv(w8a8_kernels.ENV, "vnni")
    with pytest.raises(LayerSkipConfigError, match=r"=vnni: vLLM's int8 kernel needs an "
                                                    r"AVX512-VNNI CPU, bf16 and weights of 16 x 32 "
                                                    r"tiles; here dtype torch.float32"):
        QuantizedLinear(linear(64, 128), "w8a8")


def test_w8a8_without_fbgemm_says_what_to_use(monkeypatch):
    monkeypatch.setattr(w8a8_kernels, "quantized_engines", lambda: ["qnnpack"])
    with pytest.raises(LayerSkipConfigError, match=r"\"w8a8\" needs torch's FBGEMM int8 kernels "
                                                    r"\(x86 CPUs\); this torch has only qnnpack. "
                                                    r"Use \"int4\"\."):
        QuantizedLinear(linear(32, 64), "w8a8")


def test_shapes_the_int4_kernel_cannot_take_fall_back_to_int8():
    assert QuantizedLinear(linear(8, 64), "int4").scheme == "int8"  # rows: tiles of 16
    copy = QuantizedLinear(linear(64, 72), "int4")  # row length: groups of 32
    assert copy.scheme == "int8"
    assert relative_error(copy.matmul(torch.ones(1, 72)), torch.ones(1, 72) @ linear(64, 72).weight.T) < 0.01


def test_row_parallel_bias_only_on_rank_0_and_no_bias_when_skipped():
    x = torch.randn(2, 64)
    rank0 = linear(32, 64, bias=True, input_is_parallel=True, tp_rank=0, tp_size=1)
    rank1 = linear(32, 64, bias=True, input_is_parallel=True, tp_rank=1, tp_size=1)
    skipped = linear(32, 64, bias=True, skip_bias_add=True)
    assert QuantizedLinear(rank0, "int8").bias is not None
    assert QuantizedLinear(rank1, "int8").bias is None
    assert QuantizedLinear(skipped, "int8").bias is None
    # A row-parallel layer of a tensor-parallel model all-reduces its output.
    assert QuantizedLinear(linear(32, 64, input_is_parallel=True, tp_size=2), "int8").all_reduce
    assert not QuantizedLinear(linear(32, 64, tp_size=2), "int8").all_reduce  # column-parallel
    out = QuantizedLinear(linear(32, 64, return_bias=False), "int8")(x)
    assert isinstance(out, torch.Tensor)


def test_attach_skips_layers_without_a_plain_weight():
    empty = linear(8, 32)
    empty.weight = nn.Parameter(torch.empty(0), requires_grad=False)
    attach(empty, "int4")
    assert not hasattr(empty, ATTR)
    full = linear(16, 32)
    attach(full, "int4")
    assert getattr(full, ATTR).scheme == "int4"


class Attention:
    """vLLM's attention forward, reduced to its two projections."""

    def __init__(self, hidden):
        self.hidden, self.qkv_proj, self.o_proj = hidden, linear(3 * hidden, hidden), linear(hidden, hidden)

    def forward(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        out, _ = self.o_proj(qkv[:, : self.hidden] + positions[:, None])
        return out


class MLP:
    """vLLM's gated MLP forward."""

    def __init__(self, hidden, inter):
        self.gate_up_proj, self.down_proj = linear(2 * inter, hidden), linear(hidden, inter)
        self.act_fn = lambda x: nn.functional.silu(x[:, :inter]) * x[:, inter:]

    def forward(self, x):
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


def decoder_layer(scheme: str | None, hidden=64, inter=96):
    attn, mlp = Attention(hidden), MLP(hidden, inter)
    layer = SimpleNamespace(self_attn=attn, mlp=mlp, input_layernorm=None,
                            post_attention_layernorm=None)
    if scheme:
        for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            attach(m, scheme)
    return layer


def test_draft_layer_is_the_models_layer_through_the_copies():
    layer = decoder_layer("int8")
    x = torch.randn(2, 64)
    (view,) = draft_layers([layer])
    positions = torch.tensor([3.0, 4.0])
    attn = layer.self_attn
    want = nn.functional.linear(nn.functional.linear(x, attn.qkv_proj.weight)[:, :64] + positions[:, None],
                                attn.o_proj.weight)
    got = view.self_attn(positions=positions, hidden_states=x)
    assert 0 < relative_error(got, want) < 0.02
    gate_up = nn.functional.linear(x, layer.mlp.gate_up_proj.weight)
    want = nn.functional.linear(layer.mlp.act_fn(gate_up), layer.mlp.down_proj.weight)
    assert relative_error(view.mlp(x), want) < 0.02


def test_draft_layers_none_without_copies_and_an_error_when_some_lack_them():
    assert draft_layers([decoder_layer(None), decoder_layer(None)]) is None
    with pytest.raises(LayerSkipConfigError, match=r"decoder layers \[1\]: they are not plain"):
        draft_layers([decoder_layer("int4"), decoder_layer(None)])


@pytest.mark.parametrize("scheme,small,large", [("int4", 4, 5), ("int8", 2, 3)])
def test_draft_passes_use_the_copies_only_while_they_are_faster(scheme, small, large):
    layers = [decoder_layer(scheme)]
    stack = DecoderStack(model=None, inner=None, layers=layers, draft=draft_layers(layers))
    assert stack.draft_path(small) is stack.draft
    assert stack.draft_path(large) is stack.layers
    assert DecoderStack(model=None, inner=None, layers=layers).draft_path(1) is layers


def test_w8a8_copies_serve_passes_of_any_size():
    layers = [decoder_layer("w8a8")]
    stack = DecoderStack(model=None, inner=None, layers=layers, draft=draft_layers(layers))
    assert stack.draft_path(1) is stack.draft and stack.draft_path(4096) is stack.draft
    assert stack.draft[0].max_tokens is None  # status: "max_tokens_per_pass": null


def test_option_errors_name_the_value_and_the_choices():
    assert LayerSkipOptions(draft_weights="int4").draft_weights == "int4"
    assert LayerSkipOptions().draft_weights is None
    with pytest.raises(LayerSkipConfigError, match=r"must be one of 'int4', 'w8a8', got 'INT4' "
                                                    r"\(did you mean \"int4\"\?\)"):
        LayerSkipOptions(draft_weights="INT4")
    with pytest.raises(LayerSkipConfigError, match="got 4;"):
        LayerSkipOptions(draft_weights=4)


def test_gpu_weights_are_refused_with_what_to_do():
    layer = SimpleNamespace(weight=SimpleNamespace(detach=lambda: SimpleNamespace(
        device=torch.device("meta"), dtype=torch.bfloat16, shape=(8, 32))))
    with pytest.raises(LayerSkipConfigError, match="runs on CPU only.*Remove the key"):
        QuantizedLinear(layer, "int4")
    assert draft_weights.SCHEMES == ("int4", "w8a8")


def test_int8_draft_weights_are_deprecated_with_what_to_use(caplog):
    """"int8" (weight-only) never paid: still accepted, with a warning naming
    the schemes to use; a misspelling is refused with a did-you-mean."""
    from vllm_layerskip.core.options import DraftingOptions

    with caplog.at_level(logging.WARNING, logger="vllm.layerskip"):
        assert DraftingOptions(draft_weights="int8").draft_weights == "int8"
    assert "'draft_weights': 'int8' is deprecated" in caplog.text
    assert 'use "int4" for one request at a time or "w8a8" for many' in caplog.text
    with pytest.raises(LayerSkipConfigError,
                       match="must be one of 'int4', 'w8a8', got 'int5' \\(did you mean"):
        DraftingOptions(draft_weights="int5")


def dequantized(copy: QuantizedLinear, k: int) -> torch.Tensor:
    """The copy's weights, read back through its own kernel."""
    return copy.matmul(torch.eye(k, dtype=copy.dtype)).T


def test_int4_keeps_a_4_bit_checkpoints_grid_exactly():
    # Weights as a 4-bit checkpoint dequantizes them (GGUF Q4_K): each group of
    # 32 is step * q + offset, q using only part of 0..15 (levels 1..13 here).
    torch.manual_seed(0)
    rows, k = 64, 128
    step = torch.rand(rows, k // 32, 1) * 0.01 + 0.001
    offset = -torch.rand(rows, k // 32, 1) * 0.05
    q = torch.randint(1, 14, (rows, k // 32, 32)).float()
    layer = linear(rows, k)
    layer.weight.data = (q * step + offset).reshape(rows, k)
    on_grid = relative_error(dequantized(QuantizedLinear(layer, "int4"), k), layer.weight)
    # Gaussian weights lie on no grid: the min/max grid, a few percent off.
    gaussian = linear(rows, k)
    off_grid = relative_error(dequantized(QuantizedLinear(gaussian, "int4"), k), gaussian.weight)
    assert on_grid < 1e-4, on_grid
    assert 0.02 < off_grid < 0.12, off_grid


def test_int4_of_a_full_size_projection_while_vllm_loads_in_bf16():
    # vLLM loads a bf16 model under torch's default dtype bf16: a linspace of
    # the sampled groups' indices then came out in bf16, rounded its last index
    # past the 98,304 groups of Qwen2.5-Coder-1.5B's qkv_proj, and the engine
    # failed to start.
    layer = linear(2048, 1536, dtype=torch.bfloat16)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        copy = QuantizedLinear(layer, "int4")
    finally:
        torch.set_default_dtype(default)
    assert copy.scheme == "int4"
    x = torch.randn(1, 1536, dtype=torch.bfloat16)
    assert relative_error(copy.matmul(x), nn.functional.linear(x, layer.weight)) < 0.12


def test_draft_weights_off_the_cpu_is_refused_before_the_engine_starts(monkeypatch):
    from vllm.platforms import current_platform

    from vllm_layerskip.core.identity import ModelIdentity

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: False)
    options = LayerSkipOptions(draft_weights="int4", draft_vocab_size=0)
    model = ModelIdentity.__new__(ModelIdentity)  # draft_vocab_size 0 reads nothing of it
    with pytest.raises(LayerSkipConfigError, match=r"'draft_weights': 'int4' runs on CPU only.*remove the key"):
        options.validate_for_model(model)


def test_asked_for_draft_weights_without_copies_is_an_error_at_load():
    from vllm_layerskip.core.load_checks import check_draft_weights

    engine = SimpleNamespace(stack=SimpleNamespace(draft=None))
    with pytest.raises(LayerSkipConfigError, match="was asked for but the model's linear layers "
                                                   "were loaded without a draft copy"):
        check_draft_weights("layer_skip", "int4", engine)


def grid_weight(rows=64, k=128, dtype=torch.float32):
    """(layer, q, step, offset): weights on a 4-bit grid, as a checkpoint dequantized
    from GGUF Q4_K has them: each group of 32 is step * q + offset, q in part of
    0..15, steps and values of the 1.5B model's order (steps 0.005-0.01)."""
    torch.manual_seed(1)
    step = torch.rand(rows, k // 32, 1) * 0.005 + 0.005
    offset = -step * (6 + 2 * torch.rand(rows, k // 32, 1))
    q = torch.randint(1, 14, (rows, k // 32, 32)).float()
    layer = linear(rows, k, dtype=dtype)
    layer.weight.data = (q * step + offset).reshape(rows, k).to(dtype)
    return layer, q, step, offset


def test_the_auto_grid_keeps_a_4_bit_checkpoints_grid_and_minmax_does_not():
    layer, q, step, offset = grid_weight(dtype=torch.bfloat16)
    rows, k = layer.weight.shape
    auto = relative_error(dequantized(QuantizedLinear(layer, "int4", "auto"), k), layer.weight)
    minmax = relative_error(dequantized(QuantizedLinear(layer, "int4", "minmax"), k), layer.weight)
    # The best a bf16 copy can do: the true grid, its step and zero rounded to
    # bf16 as the kernel stores them, the output rounded to bf16.
    low = q.amin(dim=-1, keepdim=True)
    zero = (low * step + offset + 8 * step).to(torch.bfloat16).float()
    best = ((q - low - 8) * step.to(torch.bfloat16).float() + zero).reshape(rows, k)
    floor = relative_error(best.to(torch.bfloat16), layer.weight)
    assert 0 < floor < 0.005, floor
    assert auto < 1.2 * floor, (auto, floor)
    assert minmax > 10 * floor, (minmax, floor)  # ~6%: most weights fall between its levels
    assert QuantizedLinear(layer, "int4").grid == "auto"  # the default


def test_on_weights_without_a_grid_both_grids_give_the_same_copy():
    layer = linear(64, 128, dtype=torch.bfloat16)
    auto, minmax = QuantizedLinear(layer, "int4", "auto"), QuantizedLinear(layer, "int4", "minmax")
    assert torch.equal(auto.packed, minmax.packed) and torch.equal(auto.scales, minmax.scales)


def test_attach_passes_the_grid_and_other_schemes_have_none():
    layer = grid_weight()[0]
    attach(layer, "int4", "minmax")
    assert getattr(layer, ATTR).grid == "minmax"
    assert QuantizedLinear(linear(8, 64), "int4", "minmax").grid is None  # int8 fallback
    assert QuantizedLinear(linear(32, 64), "int8").grid is None


def test_grid_option_errors_name_the_key_and_what_to_do():
    assert LayerSkipOptions(draft_weights="int4").int4_grid == "auto"
    options = LayerSkipOptions(draft_weights="int4", draft_weights_grid="minmax")
    assert options.draft_weights_grid == options.int4_grid == "minmax"
    with pytest.raises(LayerSkipConfigError, match=r"'draft_weights_grid' must be one of 'auto', "
                                                    r"'minmax', got 'MinMax' \(did you mean "
                                                    r"\"minmax\"\?\)"):
        LayerSkipOptions(draft_weights="int4", draft_weights_grid="MinMax")
    with pytest.raises(LayerSkipConfigError, match=r"got 'gguf': \"auto\" keeps"):
        LayerSkipOptions(draft_weights="int4", draft_weights_grid="gguf")
    with pytest.raises(LayerSkipConfigError, match=r"'draft_weights_grid': 'minmax' applies to int4 "
                                                    r"draft weights, and none are asked for: add "
                                                    r"\"draft_weights\": \"int4\""):
        LayerSkipOptions(draft_weights_grid="minmax")
    for scheme in ("int8", "w8a8"):
        with pytest.raises(LayerSkipConfigError, match=rf"applies to \"draft_weights\": \"int4\" "
                                                        rf"only; '{scheme}' has one symmetric scale"):
            LayerSkipOptions(draft_weights=scheme, draft_weights_grid="auto")
    # A bad scheme is named as such, not as a grid problem.
    with pytest.raises(LayerSkipConfigError, match=r"'draft_weights' must be one of"):
        LayerSkipOptions(draft_weights="int3", draft_weights_grid="auto")
