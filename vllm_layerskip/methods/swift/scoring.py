"""SWIFT's scoring pass: how well a candidate skip set predicts recent verified
text (its "matchness"), in one pass over windows of it, writing no KV."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_layerskip.core.draft_batch import query_positions
from vllm_layerskip.core.skip_mask import SkipMask


@dataclass
class ScoreWindows:
    """Recent verified tokens of some requests, to score a candidate mask on.

    Window w covers positions starts[w] .. starts[w] + lengths[w] - 1 of request
    row rows[w]; every one of them already holds the target's KV. The draft
    predicts, at each position, the token at the next position (`targets`).
    """

    rows: np.ndarray  # [W] input-batch rows
    starts: np.ndarray  # [W]
    lengths: np.ndarray  # [W]
    input_ids: np.ndarray  # [N] tokens at the window positions, window by window
    targets: np.ndarray  # [N] the token that followed each of them

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def positions(self) -> np.ndarray:  # [N]
        return query_positions(self.starts, self.lengths)


@torch.inference_mode()
def score_windows(engine, runner, windows: ScoreWindows, mask: SkipMask) -> np.ndarray:
    """Which window tokens the masked draft predicts exactly ([N] bool): one
    pass over all windows at once, causal within each window; attention reads
    the target's own KV at the window positions and nothing is written."""
    logits = engine.forward_queries(runner, windows.rows, windows.lengths, windows.input_ids,
                                    windows.positions, mask, write_kv=False)
    predicted = engine.head.to_token_ids(logits.argmax(dim=-1)).cpu().numpy()
    return predicted == windows.targets


class WindowScorer:
    """The draft engine as SWIFT's search sees it: a set's predictions on windows."""

    def __init__(self, engine):
        self.engine = engine

    def score(self, runner, windows: ScoreWindows, mask: SkipMask) -> np.ndarray:
        return score_windows(self.engine, runner, windows, mask)
