"""Speculative decoding: draft K tokens cheaply, verify them in ONE target forward, keep what the target agrees with.

Invariant between rounds: `context` is prompt + generated tokens, and the target's cache holds
context[:-1]. A round feeds the last context token plus the K draft tokens ([K+1] positions), so
row i of the target's logits scores draft token i, and row K scores the bonus token.

The output is exactly the target's: token for token under greedy decoding, and in distribution
when sampling (see engine.decoding.sampling.accept_reject).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

from engine.decoding.drafters import (
    BeginsRequests,
    Cancelled,
    Drafter,
    ProposesTrees,
    ReadsPrompt,
    ReadsTargetFeatures,
    capability,
    empty_draft,
)
from engine.decoding.planner import DraftPlanner, Plan
from engine.decoding.reply_stream import ReplyStream
from engine.decoding.round_record import plain_probe_due, record_round, time_round
from engine.decoding.sampling import (
    PositionNoise,
    accept_reject,
    coupled_accept,
    coupled_sample,
    greedy_accept,
    probs_from_logits,
    sample,
)
from engine.decoding.tree import verify_tree
from engine.events import Event, Finished, PrefillProgress, RoundStats
from engine.runtime.eager import ids_on
from engine.runtime.protocol import Runner, TreeRunner
from engine.settings import SamplingSettings, SpeculationSettings
from engine.stats import GenerationStats


@dataclass
class RoundResult:
    tokens: list[int]  # accepted draft tokens, then the target's own token
    drafted: int
    num_accepted: int
    draft_s: float
    verify_s: float
    catch_up_s: float = 0.0  # part of draft_s spent reading skipped tokens, not drafting
    verify_size: int = 1  # tokens the verify forward ran: drafted + 1, or more when padded
    tree_nodes: int = 0  # nodes off the main branch verified with it (0: a chain round)
    off_chain: bool = False  # the accepted path left the main branch
    # a side node stood where the main branch was rejected (or the path took one): what tells how
    # often a side node saves a round (KController.side_acceptance)
    side_chance: bool = False
    chain_accepted: int | None = None  # in a tree round: draft tokens kept along the main branch


def make_generator(sampling: SamplingSettings, device) -> torch.Generator:
    """One generator per request and device, for unseeded sampling (seeded requests use PositionNoise)."""
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def make_noise(sampling: SamplingSettings, device) -> PositionNoise | None:
    """Seeded sampling draws its noise per context index, so the run repeats exactly under adaptive K."""
    if sampling.greedy or sampling.seed is None:
        return None
    return PositionNoise(sampling.seed, device)


def speculative_round(
    target: Runner,
    drafter: Drafter | None,
    context: list[int],
    k: int,
    sampling: SamplingSettings,
    generator: torch.Generator,
    cancel: threading.Event | None,
    *,
    verify_size: int | None = None,
    noise: PositionNoise | None = None,
    tree_room: Callable[[int], int] | None = None,
) -> RoundResult:
    # 1. Draft up to k tokens (k = 0 or no drafter: a plain decoding step).
    clock = RoundClock(target.device)
    drafting = drafter is not None and k > 0
    draft = drafter.propose(context, k) if drafting else empty_draft(target.vocab_size, target.device)
    clock.mark()
    if cancel is not None and cancel.is_set():
        if drafting:
            drafter.update([])
        raise Cancelled

    # 2a. A token tree: the draft plus the drafter's other candidates, where the plan gives room for
    #     a draft of this length.
    drafted = len(draft)
    branches = capability(drafter, ProposesTrees) if drafting and drafted > 0 else None
    trees = branches is not None and tree_room is not None and target.supports_trees
    tree_size = tree_room(drafted) if trees else drafted + 1
    if tree_size > drafted + 1:
        tree = branches.tree(context, draft.tokens.tolist(), tree_size - 1)
        if tree is not None:
            # a runner that supports trees is a TreeRunner
            outcome, _ = verify_tree(cast(TreeRunner, target), tree, context, sampling, generator, noise)
            clock.mark()
            drafter.update(outcome.accepted)
            off_chain = any(node >= tree.chain_length for node in outcome.path)
            rejected_at = len(outcome.accepted)
            draft_s, verify_s = clock.split()
            return RoundResult(
                tokens=outcome.accepted + [outcome.next_token],
                drafted=drafted,
                num_accepted=len(outcome.accepted),
                draft_s=draft_s,
                verify_s=verify_s,
                catch_up_s=draft.catch_up_s,
                verify_size=len(tree) + 1,
                tree_nodes=len(tree) - drafted,
                off_chain=off_chain,
                side_chance=off_chain or (rejected_at < drafted and tree.has_side_node_at(rejected_at)),
                chain_accepted=sum(node < tree.chain_length for node in outcome.path),
            )

    # 2. Verify: one target forward over the last context token and the draft tokens, padded to
    #    `verify_size` when the cost curve says a larger forward is cheaper here (the padding rows
    #    come after every real row, so causal attention keeps them out of the real rows' logits).
    size = verify_size if verify_size is not None and drafted == k else drafted + 1
    size = max(size, drafted + 1)
    last_token = ids_on(target.device, [context[-1]])
    padding = last_token.expand(size - drafted - 1)
    target_logits = target.forward(torch.cat([last_token, draft.tokens, padding]))[: drafted + 1]  # [K+1, V]

    # 3. Accept a prefix of the draft, then take the target's token: the correction at the first
    #    rejected position, or the bonus token after the last draft token.
    draft_tokens = draft.tokens.unsqueeze(0)  # [1, K]
    if sampling.greedy:
        num_accepted, next_token = greedy_accept(draft_tokens, target_logits.unsqueeze(0))
    elif noise is not None:
        target_probs = probs_from_logits(target_logits, sampling)  # [K+1, V]
        race = noise.race(len(context), drafted + 1, target_probs.size(-1))  # [K+1, V]
        num_accepted, next_token = coupled_accept(draft_tokens, target_probs.unsqueeze(0), race.unsqueeze(0))
    else:
        target_probs = probs_from_logits(target_logits, sampling)  # [K+1, V]
        num_accepted, next_token = accept_reject(
            draft_tokens, draft.probs.unsqueeze(0), target_probs.unsqueeze(0), generator
        )
    clock.mark()
    n, next_id, *draft_ids = torch.cat(
        [num_accepted, next_token, draft.tokens]
    ).tolist()  # the round's host sync

    # 4. Roll both caches back past the rejected draft tokens (and any padding).
    accepted = draft_ids[:n]
    target.rollback(len(context) + n)  # holds context + accepted; the next token is fed next round
    if drafting:
        drafter.update(accepted)
    draft_s, verify_s = clock.split()
    return RoundResult(
        tokens=accepted + [next_id],
        drafted=drafted,
        num_accepted=n,
        draft_s=draft_s,
        verify_s=verify_s,
        catch_up_s=draft.catch_up_s,
        verify_size=size,
    )


class RoundClock:
    """A round's draft and verify times. On a GPU, from events read after the round's one host sync
    (the accepted count), so timing the draft apart costs no sync of its own; elsewhere the host clock."""

    def __init__(self, device: torch.device):
        self.events = (
            [torch.cuda.Event(enable_timing=True) for _ in range(3)] if device.type == "cuda" else None
        )
        # the stream the target's work runs on, which need not be the current device's
        self.stream = torch.cuda.current_stream(device) if self.events is not None else None
        self.times: list[float] = []
        self.mark()

    def mark(self) -> None:
        """The round's start, the draft's end, the verify's end."""
        if self.events is not None:
            self.events[len(self.times)].record(self.stream)
        self.times.append(time.perf_counter())

    def split(self) -> tuple[float, float]:
        """(draft seconds, verify seconds), once the three marks are made."""
        if self.events is None:
            return self.times[1] - self.times[0], self.times[2] - self.times[1]
        start, drafted, verified = self.events
        verified.synchronize()  # done already when the accepted count was read
        return start.elapsed_time(drafted) / 1000, drafted.elapsed_time(verified) / 1000


PREFILL_CHUNK = 512  # prompt tokens per target forward; cancelling is checked between chunks


class PrefillMeter:
    """Reports a long prompt's reading as PrefillProgress events: how far it is, and the time left at
    the speed of the chunks read so far."""

    def __init__(self, total: int, prompt_tokens: int, emit: Callable[[Event], None]):
        self.total, self.prompt_tokens, self.emit = total, prompt_tokens, emit
        self.read = 0
        self.started = time.perf_counter()
        emit(PrefillProgress(0, total, None, prompt_tokens))

    def advance(self, tokens: int) -> None:
        self.read += tokens
        seconds = time.perf_counter() - self.started
        left = seconds / self.read * (self.total - self.read)
        self.emit(PrefillProgress(self.read, self.total, left, self.prompt_tokens))


def prefill(
    target: Runner,
    prompt_ids: list[int],
    sampling: SamplingSettings,
    generator,
    noise=None,
    cancel=None,
    on_event: Callable[[Event], None] | None = None,
) -> int:
    """Brings the target cache from prompt_ids[:cache_length] to the whole prompt; returns the first token.

    The prompt goes in PREFILL_CHUNK tokens at a time, and a set `cancel` raises Cancelled between
    chunks, so a long prompt can be stopped within one chunk's forward. A prompt of more than one
    chunk reports its progress to `on_event` (PrefillMeter), each chunk waited for so it is timed."""
    keep = min(target.cache_length, len(prompt_ids) - 1)
    target.rollback(keep)
    rest = prompt_ids[keep:]
    chunks = [rest[start : start + PREFILL_CHUNK] for start in range(0, len(rest), PREFILL_CHUNK)]
    meter = PrefillMeter(len(rest), len(prompt_ids), on_event) if on_event and len(chunks) > 1 else None
    for chunk in chunks[:-1]:
        target.prefill(chunk)
        if meter is not None:
            target.synchronize()
            meter.advance(len(chunk))
        if cancel is not None and cancel.is_set():
            raise Cancelled
    logits = target.prefill(chunks[-1])  # [V]
    probs = probs_from_logits(logits, sampling)
    if sampling.greedy:
        first = probs.argmax()
    elif noise is not None:
        first = coupled_sample(probs, noise.race(len(prompt_ids), 1, probs.size(-1))[0])
    else:
        first = sample(probs, generator)
    first_token = int(first.item())
    if meter is not None:
        meter.advance(len(chunks[-1]))
    return first_token


def generate(
    target: Runner,
    planner: DraftPlanner,
    prompt_ids: list[int],
    sampling: SamplingSettings,
    speculation: SpeculationSettings,
    eos_ids: set[int],
    tokenizer,
    on_event: Callable[[Event], None] | None = None,
    cancel: threading.Event | None = None,
    *,
    stats: GenerationStats | None = None,
) -> Finished:
    """Generates after `prompt_ids`. The target cache must hold prompt_ids[:target.cache_length]
    (anything from an earlier turn that matches); only the rest is prefilled.

    `planner` owns the drafters and chooses each round's drafter and K (ChatEngine keeps it across
    turns; planner.planner_for makes one); a planner without drafters decodes plainly."""
    emit = on_event or (lambda event: None)
    stats = stats or GenerationStats()
    generator = make_generator(sampling, target.device)
    noise = make_noise(sampling, target.device)
    for member in planner.drafters:
        if (starting := capability(member, BeginsRequests)) is not None:
            starting.begin(sampling, generator, cancel, speculation.p_min, noise)
    # drafters that read the target's features (draft heads) get them after every forward
    readers = [
        reader
        for member in planner.drafters
        if (reader := capability(member, ReadsTargetFeatures)) is not None and reader.wants_hidden
    ]
    target.capture_hidden = readers[0].wants_hidden if readers else ()
    # Token trees for greedy decoding only. A tree's nodes are fixed candidates that the target's own
    # sample must hit: unseeded sampling checks a chain by rejection sampling instead, which keeps more
    # draft tokens than a match of two independent samples would. Seeded sampling draws both from one
    # noise, so trees would keep as much, but on a CPU they measured 2-5 % slower than chains there
    # (README, "token trees sized by what their side nodes save"), where greedy they broke even.
    trees = sampling.greedy
    planner.start_reply(sampled=not sampling.greedy)
    stats.drafter = planner.name
    stats.k_mode = "fixed" if not speculation.adaptive else "adaptive"
    stats.prompt_tokens = len(prompt_ids)
    base_note = stats.note
    reply = ReplyStream(prompt_ids, tokenizer, eos_ids, sampling.stop, stats, emit)
    context = reply.context  # the prompt and the reply so far: the one list the stream appends to
    started = reply.started

    if cancel is not None and cancel.is_set():
        return reply.finish("cancelled")
    stats.prefill_tokens = len(prompt_ids) - min(target.cache_length, len(prompt_ids) - 1)
    try:
        first_token = prefill(target, prompt_ids, sampling, generator, noise, cancel, on_event)
    except Cancelled:
        return reply.finish("cancelled")
    stats.prefill_time_s = stats.ttft_s = time.perf_counter() - started
    if cancel is not None and cancel.is_set():
        return reply.finish("cancelled")
    for reader in readers:
        reader.observe_target(target.last_hidden, prompt_ids + [first_token])
    reason = reply.publish([first_token], ["target"])
    if reason is not None:
        rollback_target_to_context(target, context)
        return reply.finish(reason)
    readers_of_prompts = [
        r for member in planner.drafters if (r := capability(member, ReadsPrompt)) is not None
    ]
    if readers_of_prompts:
        # The draft reads the prompt now, as prompt processing: charged to drafting, a long prompt
        # would make every drafted token look expensive and adaptive K would stop drafting.
        drafter_started = time.perf_counter()
        try:
            for member in readers_of_prompts:
                # a draft model that loses here reads the prompt on its next probe, if one comes
                if not (planner.plain and member.prompt_can_wait):
                    member.prefill(prompt_ids)
        except Cancelled:
            return reply.finish("cancelled")
        stats.prefill_time_s += time.perf_counter() - drafter_started

    while True:
        budget = min(sampling.max_new_tokens - stats.generated_tokens, target.context_length - len(context))
        if budget <= 0:
            return reply.finish("max_tokens")
        # a runner may verify at most so many tokens at once (FastRunner.verify_limit)
        most = target.verify_limit
        limit = budget - 1 if most is None else min(budget, most) - 1
        round_started = time.perf_counter()
        probing = plain_probe_due(stats, planner, speculation)
        plan = Plan.plain_step() if probing else planner.plan(context, limit=limit)
        try:
            result = speculative_round(
                target,
                plan.drafter,
                context,
                plan.k,
                sampling,
                generator,
                cancel,
                verify_size=plan.verify_size,
                noise=noise,
                tree_room=plan.tree_room if trees else None,
            )
        except Cancelled:
            return reply.finish("cancelled")
        planner.observe(plan, result)
        provenance = ["draft"] * result.num_accepted
        provenance.append("bonus" if result.drafted and result.num_accepted == result.drafted else "target")
        before = len(context)
        reason = reply.publish(result.tokens, provenance)
        record_round(stats, planner, plan, result, kept=len(context) - before)
        stats.note = " ".join(filter(None, [base_note, planner.note()]))
        for reader in readers:
            reader.observe_target(target.last_hidden, context)
        time_round(stats, result, kept=len(context) - before, seconds=time.perf_counter() - round_started)
        stats.total_time_s = time.perf_counter() - started
        if reason is not None:
            rollback_target_to_context(target, context)
            return reply.finish(reason)
        emit(RoundStats(stats.copy()))
        if cancel is not None and cancel.is_set():
            return reply.finish("cancelled")


def rollback_target_to_context(target: Runner, context: list[int]) -> None:
    """After a reply ends early inside a round, drop cached tokens past context[:-1]."""
    target.rollback(min(target.cache_length, len(context) - 1))
