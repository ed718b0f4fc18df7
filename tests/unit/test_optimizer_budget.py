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


def test_a_run_waits_until_the_credit_covers_its_expected_cost():
    """SWIFT's scoring passes are lumpy (~60 ms on SmolLM2, two plain steps):
    a run allowed at any credit >= 0 went ahead at once and overdrew by a whole
    pass, so a short run paid several passes in its first minutes. Now the
    first run waits for the credit of `first_run_steps` mean engine steps,
    every later one for what the last cost, and the work done never runs ahead
    of what the share earned by more than one run's excess over its expectation."""
    share, step_s, run_s = 0.01, 0.03, 0.061
    budget = OptimizerBudget(share, first_run_steps=2)
    now, earned, charged, run_times = 0.0, 0.0, 0.0, []
    budget.step(now, learning=False)
    while now < 180.0:
        now += step_s
        budget.step(now, learning=False)
        earned += share / IDLE_SLOWDOWN * step_s
        if budget.allows():
            budget.charge(run_s)
            charged += run_s
            run_times.append(now)
        assert charged <= earned + (run_s - 2 * step_s) + 1e-9, now
    # The first when two steps' time is earned (0.06 s at 1/8 of 0.01: 48 s),
    # the next when 0.061 s are back (the first overdrew by 0.001): 49.6 s later.
    assert run_times[0] == pytest.approx(48.0, abs=step_s)
    assert run_times[1] - run_times[0] == pytest.approx(49.6, abs=step_s)
    assert len(run_times) == 3
    # Work between runs (SWIFT's thread) is charged but sets no expectation.
    budget.charge(0.001, run=False)
    assert budget.expected_run == run_s
