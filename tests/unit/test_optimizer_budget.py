"""The optimizers' time budget (core/optimizer_budget.py) across a pause of
drafting; its share and burst cap are tested through SWIFT and CLaSp
(test_swift_optimizer.py, test_clasp_dp_scheduler.py)."""

import pytest

from vllm_layerskip.core.optimizer_budget import IDLE_SLOWDOWN, OptimizerBudget


def test_a_paused_span_earns_the_optimizer_budget_no_credit():
    """bench_interleaved.py pauses drafting for two spans in three: the paused
    steps are plain decoding measured apart, so the optimizer's share must not
    be earned on them and spent in the drafting span."""
    budget = OptimizerBudget(0.01)
    for now in (0.0, 0.1, 0.2):
        budget.step(now)
    earned = budget.credit
    assert earned == pytest.approx(0.002)
    budget.pause()
    budget.step(0.9)  # the first step after the pause: 0.7 s were not ours
    assert budget.credit == pytest.approx(earned)
    budget.step(1.0)
    assert budget.credit == pytest.approx(earned + 0.001)
    unpaused = OptimizerBudget(0.01)
    for now in (0.0, 0.1, 0.2, 0.9):
        unpaused.step(now)
    assert unpaused.credit == pytest.approx(0.009)  # what the pause keeps out


def test_a_step_while_self_drafts_are_off_earns_a_part_of_the_share():
    """SWIFT's optimizer and CLaSp's DP earn 1/IDLE_SLOWDOWN of their share
    while the cost model keeps self-drafts off."""
    budget = OptimizerBudget(0.01)
    budget.step(0.0)
    budget.step(0.8, learning=False)
    assert budget.credit == pytest.approx(0.008 / IDLE_SLOWDOWN)
    budget.step(1.6)
    assert budget.credit == pytest.approx(0.009)
