"""Option parsing and skip-mask construction (pure functions, no engine)."""

import dataclasses
import logging

import pytest

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.skip_mask import SkipMask, uniform_skip_sets
from vllm_layerskip.methods.clasp.options import ClaspOptions
from vllm_layerskip.methods.layer_skip.options import LayerSkipOptions, build_mask
from vllm_layerskip.methods.registry import split_speculative_config

VLLM_KEYS = {"method", "num_speculative_tokens", "model", "enforce_eager"}


@pytest.mark.parametrize("num_layers,ratio", [(30, 0.3), (30, 0.5), (8, 0.2), (4, 0.9)])
def test_uniform_set_size_and_first_last_kept(num_layers, ratio):
    attn, mlp = uniform_skip_sets(num_layers, ratio)
    expected = min(round(ratio * 2 * num_layers), 2 * (num_layers - 2))
    assert len(attn) + len(mlp) == expected
    assert not {0, num_layers - 1} & (attn | mlp)


@pytest.mark.parametrize("num_layers,ratio", [(30, 0.5), (28, 0.45), (30, 0.45), (28, 0.16),
                                              (30, 0.2), (28, 0.25), (32, 0.3), (8, 0.9)])
def test_uniform_set_is_spread_evenly_and_mixes_both_kinds(num_layers, ratio):
    attn, mlp = uniform_skip_sets(num_layers, ratio)
    count = len(attn) + len(mlp)
    middle = num_layers - 2
    for j in range(1, num_layers - 1):
        a = sum(1 for i in attn if i <= j)
        m = sum(1 for i in mlp if i <= j)
        # Up to every layer j: about its share of the picks, and both kinds
        # about equally often (r = 0.45 on 28 layers once skipped 12 MLPs and
        # no attention in layers 1-12).
        assert abs((a + m) - count * j / middle) <= 1.5, (j, sorted(attn), sorted(mlp))
        assert abs(a - m) <= 1, (j, sorted(attn), sorted(mlp))


def test_uniform_set_of_qwen_at_r045():
    attn, mlp = uniform_skip_sets(28, 0.45)
    # 25 of 52 sub-layers: one a layer over 1-26 but layer 13, kinds by turns.
    assert sorted(attn) == [1, 3, 5, 7, 9, 11, 14, 16, 18, 20, 22, 24, 26]
    assert sorted(mlp) == [2, 4, 6, 8, 10, 12, 15, 17, 19, 21, 23, 25]


def test_zero_ratio_skips_nothing():
    assert uniform_skip_sets(30, 0.0) == (set(), set())
    assert build_mask(LayerSkipOptions(), 30).num_skipped == 0


def test_explicit_sets_combine_whole_layers_and_sublayers():
    mask = build_mask(LayerSkipOptions(skip_layers=[3], skip_attn=[5], skip_mlp=[7, 3]), 10)
    assert mask == SkipMask.from_sets(10, {3, 5}, {3, 7})
    assert mask.num_skipped == 4
    assert not mask.run_attn[3] and not mask.run_mlp[3]
    assert not mask.run_attn[5] and mask.run_mlp[5]
    assert mask.run_attn[7] and not mask.run_mlp[7]


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"sublayer_skip_ratio": 1.5}, "'sublayer_skip_ratio' must be in [0, 1), got 1.5"),
        ({"sublayer_skip_ratio": -0.1}, "'sublayer_skip_ratio' must be in [0, 1)"),
        ({"sublayer_skip_ratio": "half"}, "'sublayer_skip_ratio' must be a number"),
        ({"skip_layers": "3,4"}, "'skip_layers' must be a list of layer indices"),
        ({"skip_attn": [1.5]}, "'skip_attn' must be a list of layer indices"),
        ({"sublayer_skip_ratio": 0.3, "skip_layers": [2]}, "cannot be combined"),
        ({"draft_confidence_threshold": 2}, "'draft_confidence_threshold' must be in [0, 1], got 2"),
        ({"skip_layer": [2]}, "'skip_layer' (did you mean 'skip_layers'?)"),
        ({"model": "some/draft"}, "drafts with the target model itself; remove 'model'"),
    ],
)
def test_bad_options_are_rejected_with_their_key(raw, message):
    with pytest.raises(LayerSkipConfigError) as e:
        split_speculative_config({"method": "layer_skip", **raw}, VLLM_KEYS)
    assert message in str(e.value)


@pytest.mark.parametrize("method,hint", [("swfit", " (did you mean 'swift'?)"), ("medusa_skip", "")])
def test_unknown_methods_fail_clearly(method, hint):
    with pytest.raises(LayerSkipConfigError) as e:
        split_speculative_config({"method": method}, VLLM_KEYS)
    assert str(e.value) == (
        f"Unknown layer-skip method '{method}'{hint}. The methods of vllm-layerskip: "
        "layer_skip, quantized, swift, clasp, self_sd, adadecode.")


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"num_skip_layers": 0}, "'num_skip_layers' must be a positive integer (layers), got 0"),
        ({"num_skip_layers": 4.5}, "'num_skip_layers' must be a positive integer (layers), got 4.5"),
        ({"layer_skip_ratio": 1.0}, "'layer_skip_ratio' must be a number in (0, 1), got 1.0"),
        ({"layer_skip_ratio": 0.4, "num_skip_layers": 12}, "either 'num_skip_layers' or 'layer_skip_ratio'"),
        ({"layer_optimization_interval": 0},
         "'layer_optimization_interval' must be a positive integer (verify steps between DP runs), got 0"),
        ({"protect_first_layers": -1}, "'protect_first_layers' must be an integer >= 0 (layers), got -1"),
        ({"protect_last_layers": True}, "'protect_last_layers' must be an integer >= 0"),
        ({"max_dp_requests": 0}, "'max_dp_requests' must be a positive integer (requests), got 0"),
        # The paper's name for it: the key shared by every method is suggested.
        ({"draft_exiting_threshold": 0.5},
         "'draft_exiting_threshold' (did you mean 'draft_confidence_threshold'?)"),
    ],
)
def test_bad_clasp_options_are_rejected_with_their_key(raw, message):
    with pytest.raises(LayerSkipConfigError) as e:
        split_speculative_config({"method": "clasp", **raw}, VLLM_KEYS)
    assert message in str(e.value)


def test_clasp_defaults_follow_the_paper():
    method, options, _ = split_speculative_config({"method": "clasp"}, VLLM_KEYS)
    assert method == "clasp" and isinstance(options, ClaspOptions)
    assert options.num_skipped(32) == 16  # half the layers
    assert options.draft_confidence_threshold == 0.7  # the draft-exiting threshold
    assert ClaspOptions(layer_skip_ratio=0.4).num_skipped(30) == 12
    assert ClaspOptions(num_skip_layers=9).num_skipped(30) == 9


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def plugin_warnings():
    handler, logger = _Warnings(), logging.getLogger("vllm.layerskip")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("value", [True, False])
def test_removed_background_dp_is_accepted_with_one_warning(plugin_warnings, value):
    _, options, rest = split_speculative_config(
        {"method": "clasp", "num_skip_layers": 8, "background_dp": value}, VLLM_KEYS)
    assert "background_dp" not in rest
    assert plugin_warnings == [
        "vllm-layerskip clasp: 'background_dp' was removed and is ignored: the DP now "
        "always runs in the engine step. Remove it from the speculative config; the next "
        "release refuses it."]
    # Nothing else about the options changes.
    assert dataclasses.replace(options, background_dp=None) == ClaspOptions(num_skip_layers=8)


# The old key, its new name, what the new name's value is a share of, and the
# number of sub-layers (layer_skip) or layers (clasp) of 30 skipped at ratio 0.3.
RENAMED = [
    ("clasp", ClaspOptions, "layer_skip_ratio", "a share of whole decoder layers",
     lambda options: options.num_skipped(30), 9),
    ("layer_skip", LayerSkipOptions, "sublayer_skip_ratio",
     "a share of all 2L attention and MLP sub-layers",
     lambda options: build_mask(options, 30).num_skipped, 18),
]


@pytest.mark.parametrize("method,cls,new,unit,skipped,expected", RENAMED)
def test_old_skip_ratio_key_reads_as_its_new_name_with_a_warning(
        plugin_warnings, method, cls, new, unit, skipped, expected):
    _, options, _ = split_speculative_config(
        {"method": method, "num_speculative_tokens": 4, "skip_ratio": 0.3}, VLLM_KEYS)
    assert options == cls(**{new: 0.3})
    assert skipped(options) == expected  # the same set as before the rename
    assert plugin_warnings == [
        f"vllm-layerskip {method}: 'skip_ratio' is now '{new}' ({unit}). Rename it in the "
        "speculative config; the next release refuses 'skip_ratio'."]
    with pytest.raises(LayerSkipConfigError, match=f"give only '{new}'"):
        cls(**{"skip_ratio": 0.3, new: 0.2})
    with pytest.raises(LayerSkipConfigError, match=f"'{new}' must be"):
        cls(skip_ratio=1.5)


@pytest.mark.parametrize("method,typo,hint", [
    ("layer_skip", "skip_ratios", "sublayer_skip_ratio"),
    ("clasp", "skip_ratios", "layer_skip_ratio"),
    ("clasp", "background_dps", None),
])
def test_deprecated_keys_are_neither_suggested_nor_listed(method, typo, hint):
    with pytest.raises(LayerSkipConfigError) as e:
        split_speculative_config({"method": method, "num_speculative_tokens": 4, typo: 1},
                                 VLLM_KEYS)
    message = str(e.value)
    assert (f"'{typo}' (did you mean '{hint}'?)" in message) if hint else (
        f"'{typo}'. Valid keys" in message)
    valid = message.split("Valid keys: ")[1].split(" (and vLLM")[0].split(", ")
    assert "num_speculative_tokens" in valid
    assert not {"skip_ratio", "background_dp", "max_dp_context"} & set(valid)


def test_removed_clasp_keys_together_get_one_warning(plugin_warnings):
    split_speculative_config(
        {"method": "clasp", "background_dp": True, "max_dp_context": 512}, VLLM_KEYS)
    assert plugin_warnings == [
        "vllm-layerskip clasp: 'background_dp' and 'max_dp_context' were removed and are "
        "ignored: the DP now always runs in the engine step. Remove them from the "
        "speculative config; the next release refuses them."]
    split_speculative_config({"method": "clasp"}, VLLM_KEYS)
    assert len(plugin_warnings) == 1  # none without them
    with pytest.raises(LayerSkipConfigError, match="'background_dp' must be true or false"):
        split_speculative_config({"method": "clasp", "background_dp": "yes"}, VLLM_KEYS)


def test_split_keeps_vllm_keys_for_vllm():
    method, options, rest = split_speculative_config(
        {"method": "layer_skip", "num_speculative_tokens": 6, "skip_layers": [10, 12],
         "enforce_eager": True}, VLLM_KEYS)
    assert method == "layer_skip"
    assert options.skip_layers == (10, 12)
    assert rest == {"method": "layer_skip", "num_speculative_tokens": 6, "enforce_eager": True}


def test_layer_outside_model_and_skip_everything():
    with pytest.raises(LayerSkipConfigError, match=r"'skip_layers' has layer indices \[30\] outside the model, which has 30 decoder layers"):
        build_mask(LayerSkipOptions(skip_layers=[5, 30]), 30)
    with pytest.raises(LayerSkipConfigError, match="skips every attention and MLP sub-layer"):
        build_mask(LayerSkipOptions(skip_layers=list(range(4))), 4)
    with pytest.raises(LayerSkipConfigError, match="skips every"):
        build_mask(LayerSkipOptions(skip_attn=[0, 1], skip_mlp=[0, 1]), 2)
