"""Engine-core patch: a layer-skip drafter's drafts travel with the step's output.

vLLM turns async scheduling off for custom-class drafters, and without it the
engine core fetches every step's drafts with one more call to the worker after
the step (`EngineCore.post_step` -> `take_draft_token_ids`). In vLLM's default
process layout that is one more round trip between the engine-core and worker
processes per decode step (0.6 ms for a whole front end -> engine core ->
worker round trip here), paid even on the steps where the cost model drafts
nothing, which is most of them on a CPU.

The worker side (`GPUModelRunner.sample_tokens`, patches/model_runner.py)
attaches the drafts of a layer-skip drafter to the `ModelRunnerOutput` it
returns, as `take_draft_token_ids()` would hand them out. Here the scheduler
keeps them when it reads that output, and `post_step` gives them to it
instead of calling the worker. Outputs without them (other drafters, a
scheduler class that does not go through `Scheduler.update_from_output`) take
vLLM's own path.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore

from vllm_layerskip.patches import Patch, call_original

# Attribute of a ModelRunnerOutput (set by the worker) and of the Scheduler
# (kept from the output until post_step): the step's DraftTokenIds, or None.
DRAFTS_ATTR = "_layerskip_draft_token_ids"
_ABSENT = object()


def update_from_output(self, scheduler_output, model_runner_output):
    setattr(self, DRAFTS_ATTR, getattr(model_runner_output, DRAFTS_ATTR, _ABSENT))
    return call_original(Scheduler, "update_from_output")(
        self, scheduler_output, model_runner_output
    )


def post_step(self, model_executed: bool) -> None:
    drafts = getattr(self.scheduler, DRAFTS_ATTR, _ABSENT)
    if drafts is _ABSENT:
        return call_original(EngineCore, "post_step")(self, model_executed)
    setattr(self.scheduler, DRAFTS_ATTR, _ABSENT)  # one step's drafts, used once
    # The same conditions as vLLM's post_step, without the call to the worker.
    if (
        self.check_for_draft_tokens
        and not self.async_scheduling
        and model_executed
        and drafts is not None
    ):
        self.scheduler.update_draft_token_ids(drafts)


def patches() -> list[Patch]:
    return [
        Patch(Scheduler, "update_from_output", update_from_output),
        Patch(EngineCore, "post_step", post_step),
    ]
