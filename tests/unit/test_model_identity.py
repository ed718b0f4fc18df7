"""A file made for one model (skip profile, exit heads, SWIFT state) serves the
same weights under any path, and refuses another model of the same shape, with
the same message for every kind of file."""

import os
import shutil

import pytest
import torch

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import checkpoint_identity, weights_fingerprint
from vllm_layerskip.methods.adadecode.heads import ExitHeads, load_heads, save_heads
from vllm_layerskip.methods.self_sd.profile import SkipProfile, load_profile, save_profile
from vllm_layerskip.methods.swift.state_file import SwiftState, load_state, save_state


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """The same tiny Llama in two directories, one of them in bfloat16, and
    another tiny Llama of the same shape (other weights)."""
    first = tiny_model_dir("llama", num_layers=4)
    moved = str(tmp_path_factory.mktemp("moved") / "renamed-copy")
    shutil.copytree(first, moved)
    from safetensors.torch import load_file, save_file

    weights = os.path.join(moved, "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights,
              metadata={"format": "pt"})
    other = tiny_model_dir("llama", num_layers=4, seed=1)
    return checkpoint_identity(first), checkpoint_identity(moved), checkpoint_identity(other)


def _writers(identity, tmp_path):
    """One file of each kind made for `identity`: (kind, path, loader)."""
    sets = {"skip_attn": [1], "skip_mlp": [2]}
    save_profile(tmp_path / "profile.json",
                 SkipProfile(model=identity, objective={"name": "proxy", "value": 1.0}, search={}, **sets))
    save_heads(tmp_path / "heads.safetensors", ExitHeads.identity(identity, [2]))
    save_state(tmp_path / "state.json",
               SwiftState(model=identity, skip_ratio=0.3, best_attn=[1], best_mlp=[2],
                          best_matchness=0.5, optimization_finished=True))
    return [
        ("Skip profile", tmp_path / "profile.json", load_profile),
        ("Exit heads file", tmp_path / "heads.safetensors", load_heads),
        ("SWIFT state_file", tmp_path / "state.json", load_state),
    ]


def test_the_same_weights_under_another_path_are_the_same_model(models, tmp_path):
    first, moved, _ = models
    assert first.name != moved.name and first.fingerprint == moved.fingerprint is not None
    for _, path, load in _writers(first, tmp_path):
        assert load(str(path), moved) is not None  # float32 file, bfloat16 copy elsewhere: accepted


def test_another_model_of_the_same_shape_is_refused(models, tmp_path):
    first, _, other = models
    assert (first.num_layers, first.hidden_size, first.vocab_size) == (
        other.num_layers, other.hidden_size, other.vocab_size)
    for what, path, load in _writers(first, tmp_path):
        with pytest.raises(LayerSkipConfigError) as e:
            load(str(path), other)
        assert str(e.value).startswith(
            f"{what} '{path}' was made for another model (weights: file {first.fingerprint} vs "
            f"running {other.fingerprint} (other weights; file made for '{first.name}', running "
            f"'{other.name}'))."), str(e.value)


def test_shipped_files_follow_the_weights_not_the_directory_name(smollm2_path, tmp_path):
    served = tmp_path / "smollm2"  # as a user might convert it
    served.symlink_to(smollm2_path)
    identity = checkpoint_identity(str(served))
    assert identity.name == "smollm2" and identity.fingerprint == weights_fingerprint(smollm2_path)
    assert load_profile("shipped", identity).num_skipped > 0
    assert load_heads("shipped", identity).layers


def test_no_fingerprint_falls_back_to_the_model_name(tmp_path):
    assert weights_fingerprint(str(tmp_path)) is None  # no safetensors here
    assert weights_fingerprint("no-such-org/no-such-model") is None  # not cached, never fetched
