"""Method `quantized`: every layer drafts through a quantized copy of its weights."""

import pytest

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.methods.registry import METHOD_NAMES, method, split_speculative_config

VLLM_KEYS = {"method", "num_speculative_tokens"}


def test_quantized_reads_int4_weights_unless_told_otherwise():
    name, options, rest = split_speculative_config(
        {"method": "quantized", "num_speculative_tokens": 8}, VLLM_KEYS)
    assert (name, options.draft_weights, rest) == ("quantized", "int4",
                                                   {"method": "quantized", "num_speculative_tokens": 8})
    _, options, _ = split_speculative_config({"method": "quantized", "draft_weights": "w8a8"},
                                             VLLM_KEYS)
    assert options.draft_weights == "w8a8"
    assert "quantized" in METHOD_NAMES


def test_quantized_without_draft_weights_or_with_skip_keys_is_refused():
    with pytest.raises(LayerSkipConfigError, match="Method 'quantized' drafts through a "
                                                   "quantized copy of the model's weights"):
        split_speculative_config({"method": "quantized", "draft_weights": None}, VLLM_KEYS)
    with pytest.raises(LayerSkipConfigError, match=r"method 'quantized': 'skip_ratio'\. Valid keys"):
        split_speculative_config({"method": "quantized", "skip_ratio": 0.2}, VLLM_KEYS)
    with pytest.raises(LayerSkipConfigError, match=r"did you mean 'quantized'"):
        split_speculative_config({"method": "quantised"}, VLLM_KEYS)


def test_layer_skip_with_nothing_skipped_and_draft_weights_names_the_new_method(caplog):
    import logging
    from types import SimpleNamespace

    from vllm_layerskip.methods.layer_skip.options import LayerSkipOptions
    from vllm_layerskip.methods.layer_skip.proposer import LayerSkipProposer

    proposer = object.__new__(LayerSkipProposer)
    proposer.options = LayerSkipOptions(draft_weights="int4")
    proposer.engine = SimpleNamespace(num_layers=4)
    with caplog.at_level(logging.WARNING, logger="vllm.layerskip"):
        proposer.on_model_loaded()
    assert "write {\"method\": \"quantized\", \"draft_weights\": 'int4'}" in caplog.text
    caplog.clear()
    proposer.options = LayerSkipOptions(draft_weights="int4", sublayer_skip_ratio=0.25)
    with caplog.at_level(logging.WARNING, logger="vllm.layerskip"):
        proposer.on_model_loaded()
    assert "quantized" not in caplog.text
