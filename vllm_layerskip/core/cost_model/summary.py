"""The cost model's status: what core/cost_model/policy.py decided so far and
the costs and rates it weighs, as a reader of the proposer's status or log sees
them (docs/serving.md#metrics-and-status)."""

from __future__ import annotations


def policy_summary(policy) -> dict:
    """A DraftLengthPolicy's counters and estimates, rounded for reading."""
    return {
        "steps": policy.steps,
        "drafting_fraction": policy.steps_drafting / policy.steps if policy.steps else 0.0,
        "mean_draft_length": (
            policy.draft_length_sum / policy.steps_drafting if policy.steps_drafting else 0.0
        ),
        "acceptance_by_position": [round(float(r), 3) for r in policy.acceptance.rates()],
        "lookup_steps": policy.lookup_steps,
        "lookup_steps_prefilling": policy.lookup_steps_prefilling,
        "mean_lookup_length": (
            policy.lookup_length_sum / policy.lookup_steps if policy.lookup_steps else 0.0
        ),
        "lookup_acceptance_by_position": [
            round(float(r), 3) for r in policy.lookup_acceptance.rates()
        ],
        "continuation_steps": policy.continuation_steps,
        "copies_passed_over": policy.copies_passed_over,
        # Per batch-size bucket: a plain step's verify seconds, what each
        # more token costs it and what a step that verifies drafts pays on
        # top of its tokens, and the factor by which drafting steps took
        # longer than the line said lately (VerifyCost); a draft pass for that many
        # requests. What the decision weighs, for a reader of the status.
        "verify_ms": {
            bucket: {"plain": round(1000 * (line.predict(bucket) or 0.0), 1),
                     "per_token": round(1000 * line.per_token, 2),
                     "drafting_price": round(1000 * line.drafting_price, 1),
                     "drafting_bias": round(line.drafting_bias, 3)}
            for bucket, line in sorted(policy.verify_costs.items()) if len(line)
        },
        "draft_ms": {
            bucket: round(1000 * policy.draft_cost.predict(bucket), 1)
            for bucket in sorted(policy.verify_costs) if len(policy.draft_cost)
        },
        "draft_samples": len(policy.draft_cost),
        # Per bucket: drafting steps' verify and draft forwards' seconds, as
        # predicted when they were decided against as measured.
        "predicted_against_measured": {
            "verify": {b: c.as_dict() for b, c in sorted(policy.verify_checks.items())},
            "draft": {b: c.as_dict() for b, c in sorted(policy.draft_checks.items())},
        },
    }
