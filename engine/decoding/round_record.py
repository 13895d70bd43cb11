"""What each round of a reply adds to its GenerationStats, and the plain rounds that time the target
alone inside a reply (so its speed-up is measured against the same moment, not a calibration)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.settings import SpeculationSettings
from engine.stats import MIN_PLAIN_STEPS, GenerationStats

if TYPE_CHECKING:
    from engine.decoding.planner import DraftPlanner, Plan

# A reply that drafts every round still times the target alone at the same moment: from round
# PROBE_FIRST, one round in PROBE_EVERY is a plain step until the reply has MIN_PLAIN_STEPS of them
# (plain rounds the planner chose count too). Four plain rounds in a reply of a hundred tokens cost it
# about 2-3 % of its speed; a speed-up against a baseline timed at another moment was off by 40 %.
PROBE_FIRST = 2
PROBE_EVERY = 4


def plain_probe_due(stats: GenerationStats, planner: DraftPlanner, speculation: SpeculationSettings) -> bool:
    """Whether this round is a plain step that times the target alone inside the reply (PROBE_EVERY).
    Only under adaptive K: a fixed K drafts K every round, as asked."""
    if not planner.drafters or not speculation.adaptive or stats.plain_steps >= MIN_PLAIN_STEPS:
        return False
    return stats.rounds >= PROBE_FIRST and (stats.rounds - PROBE_FIRST) % PROBE_EVERY == 0


def time_round(stats: GenerationStats, result, kept: int, seconds: float) -> None:
    """A round's whole wall time (planning, drafting, verifying, publishing): the reply's cost per
    token, and for a plain step the target alone's, both timed the same way at the same moment."""
    stats.round_time_s += seconds
    stats.round_tokens += kept
    stats.round_seconds.append(seconds)
    if result.drafted == 0:
        stats.plain_step_time_s += seconds


def record_round(
    stats: GenerationStats, planner: DraftPlanner, plan: Plan, result, kept: int | None = None
) -> None:
    """`kept`: how many of the round's tokens the reply kept. A reply that ends inside a round (an end
    token, a stop string) counts only those, so the stats count the tokens the reply shows."""
    kept = len(result.tokens) if kept is None else kept
    accepted = min(result.num_accepted, kept)
    drafted = result.drafted if kept > result.num_accepted else kept  # positions past the end: not drafted
    stats.rounds += 1
    # the tokens really drafted: a drafter that stops by its own confidence drafts up to plan.k
    stats.current_k = min(plan.k, result.drafted)
    stats.k_history.append(stats.current_k)
    stats.drafter_history.append(plan.drafter_name)
    stats.drafted += drafted
    stats.accepted += accepted
    stats.accepted_lengths.append(kept)
    if result.tree_nodes:
        stats.tree_rounds += 1
        stats.tree_nodes += result.tree_nodes
        stats.off_chain_rounds += result.off_chain
    else:
        stats.padded_tokens += result.verify_size - result.drafted - 1
    if drafted and not accepted:
        stats.wasted_rounds += 1
    for position in range(drafted):
        if position == len(stats.per_position_drafted):
            stats.per_position_drafted.append(0)
            stats.per_position_accepted.append(0)
        stats.per_position_drafted[position] += 1
        stats.per_position_accepted[position] += position < accepted
    if result.drafted == 0:  # a plain step in this reply: the target alone, measured in the same conditions
        stats.plain_steps += 1  # timed by time_round
    stats.draft_time_s += result.draft_s
    stats.verify_time_s += result.verify_s
    stats.fallback_to_plain = planner.plain
    stats.alpha_estimate = planner.alpha
    stats.draft_step_time_s = planner.draft_step_s
    stats.verify_forward_s = planner.curve.to_dict()
