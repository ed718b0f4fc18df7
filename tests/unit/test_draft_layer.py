"""core/draft_layer.py: a draft pass runs vLLM's custom ops as an eager CPU
engine does, whatever the engine's compilation mode, and leaves the model's
modules as they are."""

import pytest
import torch
from torch import nn

from vllm_layerskip.core.draft_layer import DraftLayer, eager_layers


@pytest.fixture(scope="module")
def compiled_config():
    """Custom ops dispatched as in a compiled engine (vLLM's default)."""
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode

    config = VllmConfig(compilation_config=CompilationConfig(
        mode=CompilationMode.VLLM_COMPILE, custom_ops=["none"]))
    with set_current_vllm_config(config):
        yield config


class Attention(nn.Module):
    """A decoder attention forward reduced to its rotary embedding."""

    def __init__(self, rotary, heads=2, head_size=64):
        super().__init__()
        self.rotary_emb, self.width = rotary, heads * head_size

    def forward(self, positions, hidden_states):
        q, k = hidden_states[:, : self.width].clone(), hidden_states[:, self.width:].clone()
        q, k = self.rotary_emb(positions, q, k)
        return torch.cat([q, k], dim=-1)


class MLP(nn.Module):
    def __init__(self, act_fn):
        super().__init__()
        self.act_fn = act_fn

    def forward(self, x):
        return self.act_fn(x)


class Layer(nn.Module):
    def __init__(self, attn, mlp):
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm = self.post_attention_layernorm = None


def test_a_draft_layer_runs_the_cpu_forms_of_the_custom_ops(compiled_config):
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rotary = get_rope(64, max_position=128, is_neox_style=True, dtype=torch.float32)
    act = SiluAndMul()
    layer = Layer(Attention(rotary), MLP(act))
    (view,) = eager_layers([layer])
    assert isinstance(view, DraftLayer)
    # What an eager CPU engine calls: the rotary kernel, the eager activation.
    assert view._attn.rotary_emb == rotary.forward_cpu
    assert view._mlp.act_fn == act.forward_cpu
    # The model's modules are untouched: its compiled forward still verifies.
    assert layer.self_attn.rotary_emb is rotary and layer.mlp.act_fn is act
    torch.manual_seed(0)
    positions, hidden = torch.tensor([0, 5, 17]), torch.randn(3, 256)
    torch.testing.assert_close(view.self_attn(positions=positions, hidden_states=hidden),
                               layer.self_attn(positions=positions, hidden_states=hidden))
    torch.testing.assert_close(view.mlp(hidden), layer.mlp(hidden))
    assert not torch.equal(view.self_attn(positions=positions, hidden_states=hidden), hidden)


def test_linears_replace_only_the_named_projections():
    class Linear:
        def __init__(self, scale):
            self.scale = scale

        def __call__(self, x):
            return x * self.scale, None

    class Projecting(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj, self.o_proj = Linear(2.0), Linear(3.0)

        def forward(self, positions, hidden_states):
            return self.o_proj(self.qkv_proj(hidden_states)[0])[0]

    class GatedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj, self.down_proj = Linear(5.0), Linear(7.0)
            self.act_fn = torch.relu

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_up_proj(x)[0]))[0]

    layer = Layer(Projecting(), GatedMLP())
    view = DraftLayer(layer, {"qkv_proj": Linear(-1.0), "down_proj": Linear(1.0)}, max_tokens=4)
    x = torch.ones(2, 3)
    assert torch.equal(view.self_attn(positions=None, hidden_states=x), -3 * x)
    assert torch.equal(view.mlp(x), 5 * x)
    assert view.max_tokens == 4 and layer.self_attn.qkv_proj.scale == 2.0
