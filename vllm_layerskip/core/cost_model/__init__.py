"""The cost model: what drafting costs and gains, measured while serving
(verify_cost.py, estimators.py), and each step's draft source and length from
it (policy.py, continuation.py)."""

from vllm_layerskip.core.cost_model.estimators import (  # noqa: F401
    DraftCost,
    PositionAcceptance,
    argmax_length,
    expected_tokens,
)
from vllm_layerskip.core.cost_model.verify_cost import LinearCost, VerifyCost  # noqa: F401
from vllm_layerskip.core.cost_model.policy import (  # noqa: F401
    IDLE_FADE,
    MIN_DRAFT_SAMPLES,
    PROBE_LENGTH,
    PROBE_ROWS,
    DraftLengthPolicy,
    DraftPlan,
)
