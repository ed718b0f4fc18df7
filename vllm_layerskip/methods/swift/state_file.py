"""SWIFT's warm-start file: the learned skip set and the optimizer's history.

    {
      "format": "vllm-layerskip/swift-state", "version": 1,
      "model": {model, architecture, num_layers, hidden_size, vocab_size},
      "skip_ratio": 0.45,
      "best": {"skip_attn": [...], "skip_mlp": [...], "matchness": 0.61},
      "optimization_finished": false,
      "history": [{"skip_attn": [...], "skip_mlp": [...], "skip_ratio": 0.45,
                   "matchness": 0.52}, ...]
    }

`"shipped"` names the state shipped with the plugin for the running model
(methods/swift/shipped/, found by the model's identity): a set learned offline
(`vllm-layerskip learn-swift-set`). It is read, never written: SWIFT goes on from
it in memory.

Sharing: each engine (and each data-parallel rank) loads the file once at
start-up and rewrites it whole as it learns; writes go to a temporary file in
the same directory and are renamed over the old one, so a reader always sees a
complete file (last writer wins; files are never merged).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.versioned_file import SHIPPED, FileKind, write_json_atomic

STATE = FileKind(
    what="SWIFT state_file",
    noun="SWIFT state file",
    format="vllm-layerskip/swift-state",
    version=1,
    remedy="Delete the file (it is rewritten as SWIFT learns) or point 'state_file' "
           "at another path.",
    option="state_file",
    shipped_dir=Path(__file__).parent / "shipped",
    unshipped="Leave 'state_file' out, or give it a path of your own: SWIFT writes what "
              "it learns there and starts from it the next time.",
)
MAX_HISTORY = 2000
SAVE_INTERVAL_S = 5.0  # the least time between two writes that are not forced


@dataclass
class Observation:
    skip_attn: list[int]
    skip_mlp: list[int]
    skip_ratio: float
    matchness: float


@dataclass
class SwiftState:
    model: ModelIdentity
    skip_ratio: float
    best_attn: list[int]
    best_mlp: list[int]
    best_matchness: float
    optimization_finished: bool
    history: list[Observation] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "format": STATE.format,
            "version": STATE.version,
            "model": self.model.as_dict(),
            "skip_ratio": self.skip_ratio,
            "best": {
                "skip_attn": self.best_attn,
                "skip_mlp": self.best_mlp,
                "matchness": self.best_matchness,
            },
            "optimization_finished": self.optimization_finished,
            "history": [vars(o) for o in self.history[-MAX_HISTORY:]],
        }


def load_state(path: str | os.PathLike, model: ModelIdentity) -> SwiftState | None:
    """The state saved at `path` for this model (or "shipped": the one shipped
    for it); None if there is no file yet.

    Raises LayerSkipConfigError for a file that is not a SWIFT state, is
    corrupt, or was written for another model, and for "shipped" where none
    was shipped for this model.
    """
    path = STATE.resolve(str(path), model)
    if not path.exists():
        return None
    data = STATE.read_json(path)
    saved_model = STATE.saved_identity(path, data.get("model"))
    try:
        best = data["best"]
        history = [Observation(**o) for o in data.get("history", [])]
        state = SwiftState(
            model=saved_model,
            skip_ratio=float(data["skip_ratio"]),
            best_attn=[int(i) for i in best["skip_attn"]],
            best_mlp=[int(i) for i in best["skip_mlp"]],
            best_matchness=float(best["matchness"]),
            optimization_finished=bool(data["optimization_finished"]),
            history=history,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise STATE.refuse(path, f"is corrupt: missing or malformed field ({e!r})") from e
    STATE.check_model(path, saved_model, model)
    last = model.num_layers - 1
    for layers in [state.best_attn, state.best_mlp] + [
        o.skip_attn + o.skip_mlp for o in state.history
    ]:
        bad = [i for i in layers if not 1 <= i < last]
        if bad:
            raise STATE.refuse(path, f"is corrupt: layer indices {bad} outside 1..{last - 1}")
    if not 0.0 < state.skip_ratio < 1.0:
        raise STATE.refuse(path, f"is corrupt: skip_ratio {state.skip_ratio} not in (0, 1)")
    return state


def save_state(path: str | os.PathLike, state: SwiftState) -> None:
    write_json_atomic(path, state.to_json())


class StateWriter:
    """Rewrites a running search's state file, at most every SAVE_INTERVAL_S
    unless forced, through the optimizer thread (`thread.save(path, state)`).
    Only rank 0 writes; the shipped state is read only: SWIFT goes on from it
    in memory."""

    def __init__(self, path: str | None, model: ModelIdentity, is_leader: bool, thread):
        self.path = path
        self.model = model
        self.enabled = bool(path) and is_leader and path != SHIPPED
        self.thread = thread
        self.last_save = 0.0

    def maybe_save(self, sets: dict, skip_ratio: float, matchness: float, finished: bool,
                   history: list[Observation], force: bool = False) -> None:
        """`sets`: the best set's {"skip_attn": [...], "skip_mlp": [...]};
        `matchness`: its matchness, -1 before it was measured (written as 0)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last_save < SAVE_INTERVAL_S:
            return
        self.last_save = now
        state = SwiftState(
            model=self.model,
            skip_ratio=skip_ratio,
            best_attn=sets["skip_attn"],
            best_mlp=sets["skip_mlp"],
            best_matchness=max(matchness, 0.0),
            optimization_finished=finished,
            history=list(history),
        )
        self.thread.save(self.path, state)
