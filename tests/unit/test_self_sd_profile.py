"""Method self_sd's parts without an engine: the adaptive draft-exiting rule
against a hand computation, and profile loading with every refusal."""

import json

import pytest

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.methods.self_sd.options import SelfSdOptions
from vllm_layerskip.methods.self_sd.profile import PROFILE, load_profile
from vllm_layerskip.methods.self_sd.threshold import AdaptiveThreshold

SMOLLM2 = ModelIdentity("/somewhere/SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 49152)


def test_threshold_update_follows_eq_2_to_4():
    t = AdaptiveThreshold()  # gamma 0.6, alpha 0.85, eps 0.01, beta1 0.5, beta2 0.9
    # By hand: AR 0.5 -> up: 0.9*0.6 + 0.1*0.61 = 0.601
    #          AR 0.5*0.5 + 0.5*1.0 = 0.75 -> up: 0.9*0.601 + 0.1*0.611 = 0.602
    #          AR 0.875 > 0.85 -> down: 0.9*0.602 + 0.1*0.592 = 0.601
    #          AR 0.8875 -> down: 0.9*0.601 + 0.1*0.591 = 0.600
    expected = [(0.5, 0.601), (0.75, 0.602), (0.875, 0.601), (0.8875, 0.600)]
    for ar_e, (ar, gamma) in zip([0.5, 1.0, 1.0, 0.9], expected):
        assert t.update(ar_e) == pytest.approx(gamma, abs=1e-12)
        assert t.acceptance == pytest.approx(ar, abs=1e-12)
    # Sustained low acceptance raises the threshold towards stopping drafts early.
    for _ in range(300):
        t.update(0.2)
    assert t.gamma > 0.8


def _write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def test_profile_refusals(tmp_path):
    shipped = json.loads(PROFILE.resolve("shipped", SMOLLM2).read_text())
    assert load_profile("shipped", SMOLLM2).num_skipped == len(shipped["skip_attn"]) + len(shipped["skip_mlp"])

    def refused(path, message):
        with pytest.raises(LayerSkipConfigError, match=message):
            SelfSdOptions(profile=path).validate_for_model(SMOLLM2)

    refused(str(tmp_path / "none.json"), "does not exist. Create one for this model with `vllm-layerskip search")
    refused(_write(tmp_path / "a.json", "x")[:-6] + "a.json", "is not a skip profile")
    (tmp_path / "b.json").write_text("{broken")
    refused(str(tmp_path / "b.json"), "is not valid JSON")
    other = dict(shipped, model={**shipped["model"], "num_layers": 24})
    refused(_write(tmp_path / "c.json", other), r"was made for another model \(num_layers: file 24 vs running 30\)")
    renamed = dict(shipped, model={**shipped["model"], "model": "/x/OtherModel"})
    refused(_write(tmp_path / "d.json", renamed), "model: file 'OtherModel' vs running 'SmolLM2-135M-Instruct' \\(no weight fingerprint")
    refused(_write(tmp_path / "e.json", dict(shipped, skip_attn=[3, 40])), r"layer indices \[40\] outside 0..29")
    refused(_write(tmp_path / "f.json", dict(shipped, skip_attn=[], skip_mlp=[])), "skips 0 of 60 sub-layers")
    refused(_write(tmp_path / "g.json", {k: v for k, v in shipped.items() if k != "objective"}),
            "is corrupt: missing or malformed field")
    unknown = ModelIdentity("/m/Qwen-tiny", "Qwen2ForCausalLM", 4, 128, 1000)
    with pytest.raises(LayerSkipConfigError, match="No shipped skip profile for model 'Qwen-tiny'"):
        SelfSdOptions(profile="shipped").validate_for_model(unknown)
    with pytest.raises(LayerSkipConfigError, match="Method 'self_sd' needs 'profile'"):
        SelfSdOptions()
