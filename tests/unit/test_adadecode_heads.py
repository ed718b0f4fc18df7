"""Method adadecode's exit heads file: what it holds and every refusal, at
start-up, with what to do."""

import pytest
import torch

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.methods.adadecode.heads import HEADS, ExitHeads, load_heads, save_heads
from vllm_layerskip.methods.adadecode.options import AdaDecodeOptions

SMOLLM2 = ModelIdentity("/somewhere/SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 49152)
QWEN = ModelIdentity("/somewhere/Qwen2.5-Coder-1.5B-Instruct", "Qwen2ForCausalLM", 28, 1536, 151936)


def test_shipped_heads_for_qwen():
    """Found by the running model (here by name: no weights to fingerprint), four
    float16 heads that training made better than the LM head read early."""
    heads = load_heads("shipped", QWEN)
    assert heads.layers == [7, 14, 21, 25]
    assert heads.transforms.shape == (4, 1536, 1536) and heads.transforms.dtype == torch.float16
    assert HEADS.resolve("shipped", QWEN).stat().st_size < 20_000_000
    before, after = heads.heldout_kl["before"], heads.heldout_kl["after"]
    assert len(after) == 4 and all(a < b for a, b in zip(after, before))
    assert heads.training["command"].startswith("vllm-layerskip train-heads")


def test_heads_file_refusals(tmp_path):
    shipped = load_heads("shipped", SMOLLM2)
    assert shipped.layers == sorted(shipped.layers) and shipped.transforms.shape[1:] == (576, 576)
    assert HEADS.resolve("shipped", SMOLLM2).stat().st_size < 4_000_000
    assert shipped.heldout_kl["after"] and shipped.training["command"].startswith("vllm-layerskip train-heads")

    def refused(path, message):
        with pytest.raises(LayerSkipConfigError, match=message):
            AdaDecodeOptions(heads=str(path)).validate_for_model(SMOLLM2)

    save_heads(tmp_path / "good.safetensors", ExitHeads.identity(SMOLLM2, [8, 15]))
    assert load_heads(str(tmp_path / "good.safetensors"), SMOLLM2).layers == [8, 15]
    train_hint = r"Train heads for this model with `vllm-layerskip train-heads"
    refused(tmp_path / "none.safetensors", "does not exist. " + train_hint)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00garbage" * 10)
    refused(tmp_path / "junk.safetensors", "is not a readable safetensors file")
    from safetensors.torch import save_file

    save_file({"transforms": torch.zeros(1, 576, 576)}, str(tmp_path / "plain.safetensors"))
    refused(tmp_path / "plain.safetensors", "is not an exit heads file")
    other = ExitHeads.identity(ModelIdentity(SMOLLM2.model, "LlamaForCausalLM", 24, 576, 49152), [8])
    save_heads(tmp_path / "layers.safetensors", other)
    refused(tmp_path / "layers.safetensors", r"was made for another model \(num_layers: file 24 vs running 30\)")
    wide = ExitHeads.identity(ModelIdentity(SMOLLM2.model, "LlamaForCausalLM", 30, 64, 49152), [8])
    save_heads(tmp_path / "wide.safetensors", wide)
    refused(tmp_path / "wide.safetensors", "hidden_size: file 64 vs running 576")
    renamed = ExitHeads.identity(ModelIdentity("/x/OtherModel", "LlamaForCausalLM", 30, 576, 49152), [8])
    save_heads(tmp_path / "name.safetensors", renamed)
    refused(tmp_path / "name.safetensors", "model: file 'OtherModel' vs running 'SmolLM2-135M-Instruct' \\(no weight fingerprint")
    bad_layers = ExitHeads.identity(SMOLLM2, [8])
    bad_layers.layers = [30]
    save_heads(tmp_path / "l.safetensors", bad_layers)
    refused(tmp_path / "l.safetensors", r"layers \[30\] are not distinct ascending indices in 1..29")
    mismatched = ExitHeads.identity(SMOLLM2, [8, 15])
    mismatched.layers = [8]
    save_heads(tmp_path / "shape.safetensors", mismatched)
    refused(tmp_path / "shape.safetensors", r"tensor 'transforms' has shape \(2, 576, 576\), expected \(1, 576, 576\)")
    nan = ExitHeads.identity(SMOLLM2, [8])
    nan.transforms[0, 0, 0] = float("nan")
    save_heads(tmp_path / "nan.safetensors", nan)
    refused(tmp_path / "nan.safetensors", "holds NaN or infinite values")
    with pytest.raises(LayerSkipConfigError, match=r"No shipped exit heads file for model 'Qwen-tiny' \(shipped for: Qwen2.5-Coder-1.5B-Instruct, SmolLM2-135M-Instruct\)"):
        AdaDecodeOptions(heads="shipped").validate_for_model(
            ModelIdentity("/m/Qwen-tiny", "Qwen2ForCausalLM", 4, 128, 1000))
    with pytest.raises(LayerSkipConfigError, match="Method 'adadecode' needs 'heads'"):
        AdaDecodeOptions()
    with pytest.raises(LayerSkipConfigError, match=r"'threshold' must be in \[0, 1\], got 1.5"):
        AdaDecodeOptions(heads="shipped", threshold=1.5)
