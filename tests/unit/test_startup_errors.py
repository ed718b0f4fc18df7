"""Bad speculative configs fail at start-up, through vLLM's own EngineArgs path
(the one behind `vllm serve`, `LLM(...)` and `vllm bench`), with a message that
names what was wrong."""

import json

import pytest

from vllm_layerskip.core.errors import LayerSkipConfigError


def engine_config(model, speculative_config, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, dtype="float32", speculative_config=speculative_config, **kwargs
    ).create_engine_config()


def test_good_config_maps_to_our_proposer_and_reserves_lookahead(smollm2_path):
    config = engine_config(
        smollm2_path,
        {"method": "layer_skip", "num_speculative_tokens": 6, "skip_layers": [10, 12, 14, 16]},
    )
    spec = config.speculative_config
    assert spec.method == "custom_class"
    assert spec.model == "vllm_layerskip.methods.layer_skip.proposer.LayerSkipProposer"
    assert spec.layerskip.method == "layer_skip"
    assert spec.layerskip.options.skip_layers == (10, 12, 14, 16)
    # Draft KV goes into lookahead slots the scheduler must allocate.
    assert config.num_lookahead_tokens == 6


@pytest.mark.parametrize(
    "speculative_config,message",
    [
        ({"method": "layer_skip", "num_speculative_tokens": 4, "skip_layers": [29, 30]},
         "'skip_layers' has layer indices [30] outside the model, which has 30 decoder layers"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "skip_attn": [-1]},
         "'skip_attn' has layer indices [-1] outside the model"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "skip_layers": list(range(30))},
         "skips every attention and MLP sub-layer"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratio": 1.0},
         "'sublayer_skip_ratio' must be in [0, 1), got 1.0"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratios": 0.3},
         "Unknown key(s) in the speculative config for method 'layer_skip': 'sublayer_skip_ratios' (did you mean 'sublayer_skip_ratio'?)"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "draft_confidence_threshold": -0.5},
         "'draft_confidence_threshold' must be in [0, 1], got -0.5"),
        ({"method": "layer_skip"}, "Method 'layer_skip' needs 'num_speculative_tokens'"),
        ({"method": "layer_skip", "num_speculative_tokens": 0}, "'num_speculative_tokens' must be a positive integer, got 0"),
        ({"method": "adadecode", "num_speculative_tokens": 4},
         "Method 'adadecode' needs 'heads'"),
        ({"method": "self_sd", "num_speculative_tokens": 12},
         "Method 'self_sd' needs 'profile'"),
        ({"method": "self_sd", "num_speculative_tokens": 12, "profile": "/nonexistent/p.json"},
         "Skip profile '/nonexistent/p.json' does not exist. Create one for this model with `vllm-layerskip search"),
        ({"method": "self_sd", "num_speculative_tokens": 12, "profile": "shipped",
          "target_acceptance": 1.2}, "'target_acceptance' must be in [0, 1], got 1.2"),
        ({"method": "clasp", "num_speculative_tokens": 4, "num_skip_layers": 30},
         "'num_skip_layers' asks to skip 30 layers, but this model has 30 decoder layers, 0 of them protected, and the draft keeps at least one: at most 29 can be skipped."),
        ({"method": "clasp", "num_speculative_tokens": 4, "num_skip_layers": 20,
          "protect_first_layers": 6, "protect_last_layers": 6},
         "'num_skip_layers' asks to skip 20 layers, but this model has 30 decoder layers, 12 of them protected"),
        ({"method": "clasp", "num_speculative_tokens": 4, "protect_first_layers": 15,
          "protect_last_layers": 15},
         "'protect_first_layers' + 'protect_last_layers' = 30 protects every one of the model's 30 decoder layers"),
        ({"method": "clasp", "num_speculative_tokens": 4, "layer_skip_ratio": 0.01},
         "'layer_skip_ratio' 0.01 skips no layer of this model (30 decoder layers); raise it."),
        ({"method": "clasp", "num_speculative_tokens": 4, "layer_optimization_interval": -3},
         "'layer_optimization_interval' must be a positive integer (verify steps between DP runs), got -3"),
        ({"method": "clasp", "num_speculative_tokens": 4, "num_skip_layer": 8},
         "Unknown key(s) in the speculative config for method 'clasp': 'num_skip_layer' (did you mean 'num_skip_layers'?)"),
        ({"method": "clasp", "num_speculative_tokens": 4, "skip_attn": [3]},
         "Unknown key(s) in the speculative config for method 'clasp': 'skip_attn'"),
        ({"method": "clasp"}, "Method 'clasp' needs 'num_speculative_tokens'"),
        ({"method": "swift", "num_speculative_tokens": 4, "skip_ratio": 0},
         "'skip_ratio' must be a number in (0, 1), got 0"),
        ({"method": "swift", "num_speculative_tokens": 4, "skip_ratio": 1.2},
         "'skip_ratio' must be a number in (0, 1), got 1.2"),
        ({"method": "swift", "num_speculative_tokens": 4, "context_window": 0},
         "'context_window' must be a positive integer (tokens), got 0"),
        ({"method": "swift", "num_speculative_tokens": 4, "bo_interval": 2.5},
         "'bo_interval' must be a positive integer (optimization steps), got 2.5"),
        ({"method": "swift", "num_speculative_tokens": 4, "confirm_duels": -1},
         "'confirm_duels' must be an integer >= 0 (duels), got -1"),
        ({"method": "swift", "num_speculative_tokens": 4, "target_matchness": 1.5},
         "'target_matchness' must be in [0, 1], got 1.5"),
        ({"method": "swift", "num_speculative_tokens": 4, "skip_ratio": 0.005},
         "'skip_ratio' 0.005 skips no sub-layer of this model (56 candidates); raise it."),
        ({"method": "swift", "num_speculative_tokens": 4, "max_optimizer_share": 0},
         "'max_optimizer_share' must be > 0"),
        ({"method": "clasp", "num_speculative_tokens": 4, "max_optimizer_share": 0},
         "'max_optimizer_share' must be > 0 (the optimizer needs some time)"),
        ({"method": "clasp", "num_speculative_tokens": 4, "max_optimizer_share": 1.5},
         "'max_optimizer_share' must be in [0, 1], got 1.5"),
        ({"method": "swift", "num_speculative_tokens": 4, "skip_layers": [3]},
         "Unknown key(s) in the speculative config for method 'swift': 'skip_layers'"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "draft_weights": "int4",
          "draft_weights_grid": "min_max"},
         "'draft_weights_grid' must be one of 'auto', 'minmax', got 'min_max' (did you mean \"minmax\"?)"),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "draft_weights_grid": "minmax"},
         "'draft_weights_grid': 'minmax' applies to int4 draft weights, and none are asked for: "
         "add \"draft_weights\": \"int4\", or remove 'draft_weights_grid'."),
        ({"method": "swift", "num_speculative_tokens": 4, "draft_weights": "w8a8",
          "draft_weights_grid": "auto"},
         "'draft_weights_grid' applies to \"draft_weights\": \"int4\" only; 'w8a8' has one "
         "symmetric scale a row, no grid to choose."),
        ({"method": "layer_skip", "num_speculative_tokens": 4, "draft_weight_grid": "minmax"},
         "'draft_weight_grid' (did you mean 'draft_weights_grid'?)"),
    ],
)
def test_bad_config_fails_at_startup(smollm2_path, speculative_config, message):
    with pytest.raises(LayerSkipConfigError) as e:
        engine_config(smollm2_path, speculative_config)
    assert message in str(e.value)


def test_swift_config_and_corrupt_state_file(smollm2_path, tmp_path):
    config = engine_config(
        smollm2_path, {"method": "swift", "num_speculative_tokens": 8, "context_window": 16}
    )
    spec = config.speculative_config
    assert spec.model == "vllm_layerskip.methods.swift.proposer.SwiftProposer"
    assert spec.layerskip.options.context_window == 16
    assert spec.layerskip.options.skip_ratio == 0.45  # the paper's default
    assert config.num_lookahead_tokens == 8
    corrupt = tmp_path / "state.json"
    corrupt.write_text('{"format": "vllm-layerskip/swift-state", "version": 1, "model": [')
    with pytest.raises(LayerSkipConfigError, match=f"SWIFT state_file '{corrupt}' is not valid JSON"):
        engine_config(smollm2_path, {"method": "swift", "num_speculative_tokens": 4,
                                     "state_file": str(corrupt)})
    # A state ships for SmolLM2, found by the weights' identity from the converted
    # model's directory: the set its optimizer learned offline (2026-12-02).
    from vllm_layerskip.core.identity import model_identity
    from vllm_layerskip.methods.swift.state_file import load_state

    config = engine_config(smollm2_path, {"method": "swift", "num_speculative_tokens": 4,
                                          "state_file": "shipped"})
    assert config.speculative_config.layerskip.options.state_file == "shipped"
    state = load_state("shipped", model_identity(config.model_config))
    assert (state.best_attn, state.best_mlp) == (
        [2, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 20, 23], [2, 4, 5, 6, 7, 9, 10, 11, 13, 14])
    assert state.optimization_finished


def test_draft_weights_grid_reaches_the_quantizer_at_load(smollm2_path, monkeypatch):
    """The key travels in the engine's config to the linear-weights patch, which
    quantizes each layer as vLLM loads it (patches/linear_weights.py)."""
    import torch
    from torch import nn
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from vllm_layerskip.core import draft_weights_cache
    from vllm_layerskip.core.draft_weights import ATTR
    from vllm_layerskip.patches import linear_weights

    monkeypatch.setenv(draft_weights_cache.DISABLE_ENV, "0")
    spec = {"method": "layer_skip", "num_speculative_tokens": 4, "draft_weights": "int4"}
    made = {}
    for grid in (None, "minmax"):
        config = engine_config(smollm2_path, spec if grid is None else {**spec, "draft_weights_grid": grid})
        layer = nn.Module()
        layer.weight = nn.Parameter(torch.randn(32, 64, dtype=torch.bfloat16), requires_grad=False)
        layer._cpu_skip_gemm_dispatch = True  # vLLM's own step then only sets a plain linear
        with set_current_vllm_config(config):
            linear_weights.process_weights_after_loading(UnquantizedLinearMethod(), layer)
        made[grid] = getattr(layer, ATTR)
    assert made[None].scheme == "int4" and made[None].grid == "auto"
    assert made["minmax"].grid == "minmax"


def test_clasp_config_maps_to_its_proposer(smollm2_path):
    config = engine_config(
        smollm2_path, {"method": "clasp", "num_speculative_tokens": 8, "num_skip_layers": 12}
    )
    spec = config.speculative_config
    assert spec.model == "vllm_layerskip.methods.clasp.proposer.ClaspProposer"
    assert spec.layerskip.method == "clasp"
    options = spec.layerskip.options
    assert options.num_skip_layers == 12 and options.layer_optimization_interval == 16
    assert options.draft_confidence_threshold == 0.7  # the paper's draft-exiting threshold
    assert config.num_lookahead_tokens == 8


def test_unsupported_architecture(tmp_path):
    # A GPT-2 config: vLLM knows the architecture, the plugin does not.
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64,
              "n_head": 2, "n_layer": 2, "n_positions": 128, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LayerSkipConfigError) as e:
        engine_config(str(tmp_path), {"method": "layer_skip", "num_speculative_tokens": 2},
                      skip_tokenizer_init=True)
    assert "does not support architecture ['GPT2LMHeadModel']" in str(e.value)
    assert "Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM" in str(e.value)


def test_tensor_parallel_is_accepted(tiny_model_dir):
    # Every method keeps its ranks in step (tests/engine/test_tensor_parallel.py
    # runs them at tp 2); SWIFT learns its set while serving, the hardest case.
    model = tiny_model_dir("llama", num_layers=4)
    config = engine_config(model, {"method": "swift", "num_speculative_tokens": 2},
                           tensor_parallel_size=2)
    assert config.speculative_config.layerskip.method == "swift"


def test_pipeline_parallel_is_refused(smollm2_path):
    with pytest.raises(LayerSkipConfigError, match="does not support pipeline parallelism"):
        engine_config(smollm2_path, {"method": "layer_skip", "num_speculative_tokens": 2},
                      pipeline_parallel_size=2)


def test_native_methods_untouched(smollm2_path):
    config = engine_config(smollm2_path, {"method": "ngram", "num_speculative_tokens": 3,
                                          "prompt_lookup_max": 3})
    assert config.speculative_config.method == "ngram"
    assert getattr(config.speculative_config, "layerskip", None) is None
    assert config.num_lookahead_tokens == 0


def test_version_gate(monkeypatch):
    from vllm_layerskip import ALLOW_ANY_VERSION_ENV, check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.0+cpu")
    monkeypatch.delenv(ALLOW_ANY_VERSION_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"supports vLLM 0.32.0, but vLLM 0.31.1 is installed"):
        check_vllm_version("0.31.1")
    monkeypatch.setenv(ALLOW_ANY_VERSION_ENV, "1")
    check_vllm_version("0.31.1")



def test_escape_hatch_runs_the_hook_point_source_check_once(monkeypatch):
    """register() on an unsupported vLLM under VLLM_LAYERSKIP_ALLOW_ANY_VLLM=1
    checks the installed source (the message: tests/test_hook_points.py); the
    engine core and workers inherit a marker and do not repeat it."""
    import importlib.util
    from pathlib import Path

    import vllm

    import vllm_layerskip
    import vllm_layerskip.patches

    calls = []
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    monkeypatch.setenv(vllm_layerskip.ALLOW_ANY_VERSION_ENV, "1")
    monkeypatch.setenv(vllm_layerskip._HOOKS_CHECKED_ENV, "")  # restored after the test
    monkeypatch.setattr(vllm_layerskip, "report_hook_points", lambda *a: calls.append(a))
    monkeypatch.setattr(vllm_layerskip.patches, "apply_all", lambda: None)
    vllm_layerskip.register()
    vllm_layerskip.register()  # as in a child process: the marker is inherited
    site = Path(importlib.util.find_spec("vllm").origin).parent.parent
    assert calls == [("0.99.0", site, True)]
    monkeypatch.setattr(vllm, "__version__", "0.32.0")
    monkeypatch.setenv(vllm_layerskip._HOOKS_CHECKED_ENV, "")
    vllm_layerskip.register()  # a supported vLLM: no source check
    assert len(calls) == 1

def test_patched_signatures_match_installed_vllm(monkeypatch):
    import dataclasses

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_layerskip.patches import Patch, all_patches, check_signatures, hook_table

    assert check_signatures() == []
    # Each patch's signature is its hook-table entry's, declared once.
    for patch in all_patches():
        assert patch.hook.name.endswith(patch.name) and (
            patch.expected_params is None or patch.expected_params == patch.hook.params)
    stale = Patch(GPUModelRunner, "propose_draft_token_ids", None)
    hooks = tuple(dataclasses.replace(h, params=("self", "x"))
                  if h.name == "GPUModelRunner.propose_draft_token_ids" and h.kind == "method" else h
                  for h in hook_table.HOOKS)
    monkeypatch.setattr(hook_table, "HOOKS", hooks)
    assert stale.signature_problem() == (
        "GPUModelRunner.propose_draft_token_ids has parameters ('self', 'scheduler_output', "
        "'sampled_token_ids', 'sampling_metadata', 'hidden_states', 'sample_hidden_states', "
        "'aux_hidden_states', 'spec_decode_metadata', 'common_attn_metadata', 'slot_mappings'), "
        "expected ('self', 'x')")
    missing = Patch(GPUModelRunner, "no_such_method", None)
    assert missing.signature_problem() == "GPUModelRunner.no_such_method does not exist"
