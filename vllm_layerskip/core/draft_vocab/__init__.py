"""Draft vocabularies: which token ids a pruned draft head scores (draft_head.py),
ranked, and the file that holds them.

A file ranks token ids by how likely the model itself makes them
(`vllm-layerskip draft-vocab`, tools/draft_vocab.py): special tokens and the
chat template's tokens first, then the ids of the model's own greedy answers
by their summed probability among the top tokens at every answer position,
then the rest of the vocabulary in id order (byte-level BPE ids follow the
tokenizer's merge order, itself a frequency order). A draft with
`draft_vocab_size` N scores the first N.

The file is safetensors: one int32 tensor "token_ids" [R] (the ranking, R ids,
each once) and string metadata:

    format "vllm-layerskip/draft-vocab", version "1",
    model   {model, architecture, num_layers, hidden_size, vocab_size, fingerprint},
    source  {prompts, answers, generated_tokens, distinct_generated, max_tokens,
             size (the draft_vocab_size it was made for, used when none is given), command},
    always_included  number of leading ids that are special or chat-template tokens,
    created ISO time

It serves the model it was made for (core/identity.py), under any path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.versioned_file import FileKind

DRAFT_VOCAB = FileKind(
    what="Draft vocabulary",
    format="vllm-layerskip/draft-vocab",
    version=1,
    remedy="Make one for this model with `vllm-layerskip draft-vocab --model MODEL "
           "--size 32768 --out VOCAB.draft-vocab.safetensors`.",
    option="draft_vocab",
    suffix=".draft-vocab.safetensors",
    shipped_dir=Path(__file__).parent / "shipped",
)


@dataclass
class DraftVocab:
    model: ModelIdentity
    token_ids: torch.Tensor  # [R] int64, the ranking
    always_included: int = 0  # leading ids that are special or chat-template tokens
    source: dict = field(default_factory=dict)
    created: str = ""
    path: str = ""

    def first(self, size: int) -> torch.Tensor:
        """The `size` highest-ranked ids ([size] int64)."""
        return self.token_ids[:size]

    def metadata(self) -> dict[str, str]:
        return {
            "format": DRAFT_VOCAB.format,
            "version": str(DRAFT_VOCAB.version),
            "model": json.dumps(self.model.as_dict()),
            "source": json.dumps(self.source),
            "always_included": str(self.always_included),
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%S"),
        }


def save_draft_vocab(path: str | Path, vocab: DraftVocab) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({"token_ids": vocab.token_ids.to(torch.int32).contiguous()}, str(tmp),
              metadata=vocab.metadata())
    tmp.replace(path)  # readers never see a half-written file


def load_draft_vocab(value: str, model: ModelIdentity) -> DraftVocab:
    """Load and check a draft vocabulary for the running model (a path, or
    "shipped"); raise LayerSkipConfigError saying what is wrong."""
    from safetensors import safe_open

    path = DRAFT_VOCAB.resolve(value, model)
    meta = DRAFT_VOCAB.read_safetensors_metadata(path)
    try:
        recorded = json.loads(meta["model"])
        source = dict(json.loads(meta.get("source", "{}")))
        always = int(meta.get("always_included", "0"))
    except (KeyError, TypeError, ValueError) as e:
        raise DRAFT_VOCAB.refuse(path, f"is corrupt: missing or malformed metadata ({e!r})") from e
    saved = DRAFT_VOCAB.saved_identity(path, recorded)
    DRAFT_VOCAB.check_model(path, saved, model)
    with safe_open(str(path), framework="pt") as f:
        ids = f.get_tensor("token_ids") if "token_ids" in set(f.keys()) else None
    if ids is None or ids.ndim != 1 or ids.numel() == 0 or ids.dtype not in (torch.int32, torch.int64):
        raise DRAFT_VOCAB.refuse(path, "is corrupt: no 1-D integer tensor 'token_ids'")
    ids = ids.to(torch.int64)
    bad = ids[(ids < 0) | (ids >= model.vocab_size)]
    if bad.numel():
        raise DRAFT_VOCAB.refuse(path, f"is corrupt: token ids {bad[:5].tolist()} outside the "
                                       f"vocabulary 0..{model.vocab_size - 1}")
    if torch.unique(ids).numel() != ids.numel():
        raise DRAFT_VOCAB.refuse(path, "is corrupt: a token id is ranked twice")
    return DraftVocab(model=saved, token_ids=ids, always_included=always, source=source,
                      created=meta.get("created", ""), path=str(path))


def shipped_for(model: ModelIdentity) -> Path | None:
    """The draft vocabulary shipped for this model, if there is one."""
    try:
        return DRAFT_VOCAB.resolve("shipped", model)
    except LayerSkipConfigError:
        return None


def draft_token_ids(value: str, size: int, model: ModelIdentity) -> torch.Tensor:
    """The ids a draft with `draft_vocab_size` = size scores: the first `size` of
    the ranking `value` names (size 0: the size the file was made for)."""
    vocab = load_draft_vocab(value, model)
    ranked = vocab.token_ids.numel()
    size = size or int(vocab.source.get("size", ranked))
    if size > model.vocab_size:
        raise LayerSkipConfigError(
            f"'draft_vocab_size' {size} is larger than the model's vocabulary "
            f"({model.vocab_size} tokens). Use a smaller size, or 0 for the full vocabulary."
        )
    if size > ranked:
        raise LayerSkipConfigError(
            f"'draft_vocab_size' {size} is larger than the {ranked} token ids that "
            f"{DRAFT_VOCAB.what.lower()} '{vocab.path}' ranks. Use at most {ranked}, or make "
            "a longer ranking with `vllm-layerskip draft-vocab --size N`."
        )
    if 0 < size < vocab.always_included:
        raise LayerSkipConfigError(
            f"'draft_vocab_size' {size} would leave out some of the {vocab.always_included} "
            "special and chat-template tokens every draft vocabulary keeps; use at least "
            f"{vocab.always_included}."
        )
    return vocab.first(size)
