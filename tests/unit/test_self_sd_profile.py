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


def test_proxy_objective_prices_a_set_by_the_weights_it_keeps():
    from types import SimpleNamespace

    from vllm_layerskip.core.skip_mask import sublayer_params
    from vllm_layerskip.methods.self_sd.objective import rescore

    # Qwen2.5-Coder-1.5B's shapes: grouped-query attention makes an attention
    # sub-layer ~7x cheaper to run than an MLP.
    qwen = SimpleNamespace(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2,
                           intermediate_size=8960, num_hidden_layers=28)
    assert sublayer_params(qwen) == (5_505_024, 41_287_680)
    # Two sets of one size with the same acceptance: the one that keeps fewer
    # weights (skips MLPs) is worth more; its measured c (noisy) does not decide.
    history = [
        {"M": 2.5, "alpha": 0.6, "c": 0.50, "kept_weights": 1000},  # skips attention
        {"M": 2.5, "alpha": 0.6, "c": 0.60, "kept_weights": 700},  # skips MLPs
        {"M": 2.5, "alpha": 0.6, "c": 0.40, "kept_weights": 850},
    ]
    rescore("proxy", history)
    assert history[1]["value"] > history[2]["value"] > history[0]["value"]
    per_weight = 0.50 / 1000  # the median of 0.5/1000, 0.6/700, 0.4/850
    assert history[1]["c_used"] == pytest.approx(per_weight * 700)
    # Checkpoints without the weights: the median c for every set, as before.
    old = [{"M": 2.0, "alpha": 0.5, "c": c} for c in (0.3, 0.5, 0.4)]
    rescore("proxy", old)
    assert {h["c_used"] for h in old} == {0.4}


def test_acceptance_objective_ranks_by_m_alone_and_needs_a_fixed_size():
    from types import SimpleNamespace

    from vllm_layerskip.methods.self_sd.objective import rescore
    from vllm_layerskip.methods.self_sd.offline_search import run_search

    # The cheapest set (fewest weights, lowest c) accepts least: acceptance ranks
    # it last where proxy would rank it first; equal M falls back on alpha.
    history = [
        {"M": 2.40, "alpha": 0.47, "c": 0.55, "kept_weights": 700},
        {"M": 2.90, "alpha": 0.63, "c": 0.80, "kept_weights": 1000},
        {"M": 2.90, "alpha": 0.64, "c": 0.80, "kept_weights": 1000},
    ]
    rescore("acceptance", history)
    assert history[2]["value"] > history[1]["value"] > history[0]["value"]
    rescore("proxy", history)
    assert history[0]["value"] > history[2]["value"]
    # With a free size M alone would search back to the full model: refused
    # before any engine is built.
    args = SimpleNamespace(objective="acceptance", skip_ratio=None, model="unused")
    with pytest.raises(LayerSkipConfigError, match="give --skip-ratio R instead of --free-size"):
        run_search(args)


def _skipped(space, mask) -> set:
    """The search coordinates a mask skips."""
    return set(space.coords([i for i, run in enumerate(mask.run_attn) if not run],
                            [i for i, run in enumerate(mask.run_mlp) if not run]))


def _fake_result(m: float) -> dict:
    """What an evaluation returns, with mean acceptance length `m`."""
    return {"tokens_per_second": 1.0, "M": m, "alpha": 0.5, "c": 0.5, "expected_speedup": 1.0,
            "seconds": 1.0, "kept_weights": 1}


def _fake_swaps_search(tmp_path, monkeypatch, evaluator, prompts: list[str], **options):
    """`search --strategy swaps --objective acceptance` over 30 evaluations of an
    8-layer model (12 coordinates, 6 skipped) by a fake evaluator, calibrating on
    the first 2 prompts: (the arguments, the profile written)."""
    from types import SimpleNamespace

    import vllm_layerskip.core.identity as identity
    from vllm_layerskip.methods.self_sd import offline_search

    monkeypatch.setattr(offline_search, "Evaluator", evaluator)
    monkeypatch.setattr(identity, "model_identity", lambda config: SMOLLM2)
    (tmp_path / "prompts.txt").write_text("".join(p + "\n" for p in prompts))
    args = SimpleNamespace(
        model="unused", prompts=str(tmp_path / "prompts.txt"), num_prompts=2, max_tokens=8,
        iterations=30, objective="acceptance", skip_ratio=0.5, k=3, init="uniform", init_from=None,
        seed=0, dtype="float32", max_model_len=256, resume=True, out=str(tmp_path / "profile.json"),
        strategy="swaps", **options)
    return args, offline_search.run_search(args)


def test_swaps_strategy_climbs_one_swap_at_a_time_from_the_seed(tmp_path, monkeypatch):
    """`--strategy swaps`: after the seed set, every candidate is the best set so
    far with one skipped sub-layer swapped for a run one, never a set already
    scored; the profile keeps the best. Scored here by a fake evaluator whose M
    counts the skipped MLP sub-layers."""
    import json
    from types import SimpleNamespace

    from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
    from vllm_layerskip.methods.self_sd import offline_search

    space = SubLayerSpace(8)  # 12 coordinates
    upper = set(range(space.dim // 2, space.dim))  # the MLPs' coordinates

    class FakeEvaluator:
        def __init__(self, *args):
            self.num_layers = 8
            self.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=None))

        def evaluate(self, mask):
            return _fake_result(1.0 + len(_skipped(space, mask) & upper))

        def close(self):
            pass

    args, profile = _fake_swaps_search(tmp_path, monkeypatch, FakeEvaluator, ["one", "two"])

    history = json.loads((tmp_path / "profile.json.search.json").read_text())["history"]
    assert history[0]["coords"] == list(space.evenly_spread(6))
    assert len({tuple(h["coords"]) for h in history}) == len(history) == 30
    for i in range(1, len(history)):
        best = max(history[:i], key=lambda h: h["value"])
        assert len(set(history[i]["coords"]) - set(best["coords"])) == 1, i
    # Six skipped sub-layers, all MLPs: M 7, reached by swaps.
    assert history[0]["M"] < 7 and profile.objective["M"] == 7
    assert profile.search["strategy"] == "swaps"

    # Swaps keep the set's size and need a set to start from: refused before any engine.
    with pytest.raises(LayerSkipConfigError, match="--strategy swaps keeps the size"):
        offline_search.run_search(SimpleNamespace(**{**vars(args), "objective": "proxy",
                                                  "skip_ratio": None}))
    with pytest.raises(LayerSkipConfigError, match="refines a starting set and was given none"):
        offline_search.run_search(SimpleNamespace(**{**vars(args), "init": "none"}))


def test_validation_prompts_choose_among_the_best_sets(tmp_path, monkeypatch):
    """`--validate-prompts N`: the `--validate-top` best sets on calibration are
    scored again on the N prompts after the calibration prompts, and the profile
    takes the best there. The fake evaluator's best calibration set (all six MLPs
    skipped) is fitted to the calibration prompts: it scores lowest on the others."""
    import json
    from types import SimpleNamespace

    from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
    from vllm_layerskip.methods.self_sd import offline_search

    space = SubLayerSpace(8)
    upper = set(range(space.dim // 2, space.dim))
    seen = {}

    class FakeEvaluator:
        def __init__(self, model, prompts, k, max_tokens, dtype, max_model_len, validation_prompts=()):
            seen["calibration"], seen["validation"], seen["validated"] = prompts, validation_prompts, []
            self.num_layers = 8
            self.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=None))

        def evaluate(self, mask, validation=False):
            skipped = _skipped(space, mask)
            m = 1.0 + len(skipped & upper)
            if validation:
                seen["validated"].append(sorted(skipped))
                m = 1.0 if skipped == upper else m
            return _fake_result(m)

        def close(self):
            pass

    args, profile = _fake_swaps_search(tmp_path, monkeypatch, FakeEvaluator,
                                       ["one", "two", "three", "four", "five"],
                                       validate_prompts=3, validate_top=4)

    assert seen["calibration"] == ["one", "two"] and seen["validation"] == ["three", "four", "five"]
    history = json.loads((tmp_path / "profile.json.search.json").read_text())["history"]
    ranked = sorted(history, key=lambda h: -h["value"])
    # The 4 best distinct sets on calibration, best first, each scored once.
    assert seen["validated"] == [h["coords"] for h in ranked[:4]]
    assert seen["validated"][0] == sorted(upper)
    record = profile.search["validation"]
    assert record["num_prompts"] == 3 and record["top"] == 4
    assert [s["calibration_value"] for s in record["sets"]] == [h["value"] for h in ranked[:4]]
    assert record["sets"][0]["M"] == 1.0
    # Chosen: a set best on the further prompts, not the calibration's best.
    chosen = space.coords(profile.skip_attn, profile.skip_mlp)
    assert list(chosen) != sorted(upper) and list(chosen) in seen["validated"]
    assert profile.objective["M"] == 6.0 == max(s["M"] for s in record["sets"])

    with pytest.raises(LayerSkipConfigError, match="the prompt file has 5 prompts, 3 after the 2"):
        offline_search.run_search(SimpleNamespace(**{**vars(args), "validate_prompts": 4}))
    with pytest.raises(LayerSkipConfigError, match="--validate-top T >= 1"):
        offline_search.run_search(SimpleNamespace(**{**vars(args), "validate_top": 0}))


def test_every_shipped_profile_loads_for_the_model_it_names():
    # A shipped file another model's engine would refuse at start-up (a typo in
    # a set, an index outside its model, an edited identity) fails here, without
    # the model's weights.
    paths = sorted(PROFILE.shipped_dir.glob("*.json"))
    assert {p.stem for p in paths} >= {"SmolLM2-135M-Instruct", "Qwen2.5-Coder-1.5B-Instruct"}
    for path in paths:
        data = json.loads(path.read_text())
        profile = load_profile("shipped", ModelIdentity.from_dict(data["model"]))
        assert profile.num_skipped == len(set(data["skip_attn"])) + len(set(data["skip_mlp"])) > 0
    qwen = json.loads((PROFILE.shipped_dir / "Qwen2.5-Coder-1.5B-Instruct.json").read_text())
    # The acceptance search's set (23 of 56 sub-layers), not the 9-sub-layer proxy set.
    assert (len(qwen["skip_attn"]), len(qwen["skip_mlp"]), qwen["objective"]["name"]) == (13, 10, "acceptance")
