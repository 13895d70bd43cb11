"""A draft head that reads the target's hidden states (EAGLE-style), drafting over a reduced vocabulary.

Each round the target's verify forward hands back its features for the positions it kept
(`observe_target`); the head appends one entry per position to its own small KV cache, then drafts
K tokens autoregressively, feeding back its own output where the target's features are not known
yet. See engine.heads.head for the layer itself.

Sampling: the head's distribution lives on N draft ids; it is warped (temperature, top-k, top-p)
there and scattered to the target's vocabulary with zeros elsewhere, so the loop's accept/reject
test sees the exact distribution each token was drawn from and the output stays the target's.
"""

from __future__ import annotations

import threading
import time

import torch
from torch import Tensor

from engine.decoding.confidence import StopRule
from engine.decoding.drafters.base import Cancelled, Draft, common_prefix_length, empty_draft
from engine.decoding.sampling import probs_from_logits, sample
from engine.heads.head import DraftHead
from engine.runtime.attention import attend_rows, rows_kernel_for
from engine.settings import SamplingSettings

# Features read in one go without drafting (plain rounds) are folded in before they pile up.
MAX_PENDING_ROWS = 256


class HeadDrafter:
    """A Drafter that begins requests, reads the target's features, stops by its confidence, proposes
    trees, reads prompts and knows its acceptance."""

    # its features come from the target's forwards, which it must fold in before they pile up
    prompt_can_wait = False

    def __init__(
        self,
        head: DraftHead,
        embed_tokens,
        target_vocab_size: int,
        context_length: int,
        name="head",
        weights: str | None = None,
    ):
        from engine.heads.quant import dtype_name

        self.head = head
        # the precision it runs at here, for the app
        self.weights = weights or f"Draft head in {dtype_name(head)}."
        self.embed_tokens = embed_tokens  # the target's own embedding module
        self.target_vocab_size = target_vocab_size
        self.name = name
        self.wants_hidden = tuple(head.config.target_layers)  # what the target's runner must capture
        self.acceptance_prior = acceptance_prior(head.config.training)
        self.acceptance_prior_weight = 1.0
        self.stop_rule: StopRule | None = None  # set by the planner before each round
        self.last_confidences: list[float] = []  # the top probability behind each token last proposed
        self.draft_ids = head.draft_ids  # [N] target id of each draft token
        config = head.config
        shape = (1, config.num_key_value_heads, context_length, config.head_dim)
        self.k_cache = torch.zeros(shape, dtype=head.dtype, device=head.device)
        self.v_cache = torch.zeros(shape, dtype=head.dtype, device=head.device)
        # attention on Tandem's row kernel where it runs: no K/V copied per query head, one call
        self.row_attention = rows_kernel_for(head.dtype, head.device, config.head_dim)
        self.valid = torch.zeros(
            context_length, dtype=torch.bool, device=head.device
        )  # [S] slots holding an entry
        self.slots = torch.arange(context_length, device=head.device)
        # RoPE's cos and sin for every slot, computed once: per draft step they were 8 small ops
        self.rope_table = head.rope(self.slots)  # ([S, D], [S, D])
        self.context_length = context_length
        self.tokens: list[int] = []  # the sequence the cached entries were computed on
        self._pending: list[tuple[int, Tensor, list[int]]] = []  # (start, features [n, F*C], sequence)
        self._last: tuple[int, Tensor] | None = None  # (position, out [C]) of the newest true entry
        self._drafted = 0
        self._runners_up: list[Tensor] = []  # per draft depth: the head's first and second choice
        self.begin(SamplingSettings(), None)

    @property
    def device(self):
        return self.k_cache.device

    def begin(
        self, sampling, generator, cancel: threading.Event | None = None, p_min: float = 0.0, noise=None
    ) -> None:
        self.sampling, self.generator, self.cancel, self.p_min = sampling, generator, cancel, p_min
        self.noise = noise

    def reset(self) -> None:
        self.valid.zero_()
        self.tokens, self._pending, self._last = [], [], None

    def observe_target(self, hidden: tuple[int, Tensor] | None, sequence: list[int]) -> None:
        """`hidden` = (start, [n, F*C]): the target's features at positions start.. of `sequence`,
        whose last token is the one chosen after the last position the head may use."""
        if hidden is None:
            return
        start, features = hidden
        rows = min(features.size(0), len(sequence) - 1 - start)
        if rows <= 0:
            return
        self._pending.append((start, features[:rows], list(sequence[: start + rows + 1])))
        if sum(f.size(0) for _, f, _ in self._pending) > MAX_PENDING_ROWS:
            self._fold_pending()

    def prefill(self, context: list[int]) -> None:
        self._fold_pending()

    @torch.inference_mode()
    def propose(self, context: list[int], k: int) -> Draft:
        started = time.perf_counter()
        read = self._fold_pending()
        # features from plain rounds: a one-off cost, not drafting's
        catch_up_s = time.perf_counter() - started if read > self._drafted + 1 else 0.0
        position = len(context) - 2  # the entry that scores the first draft token
        k = min(k, self.context_length - 1 - position)
        if self._last is None or self._last[0] != position or self.tokens != list(context) or k <= 0:
            self._drafted, self.last_confidences = 0, []
            return empty_draft(self.target_vocab_size, self.device, catch_up_s)
        out = self._last[1]  # [C]
        logits = self.head.logits(out)  # [N]
        tokens, probs, runners_up, confidences = [], [], [], []
        stop, greedy = self.stop_rule, self.sampling.greedy
        for i in range(k):
            draft_probs = None if greedy else probs_from_logits(logits.float(), self.sampling)  # [N]
            if self.p_min > 0 or stop is not None:
                confidence = self._confidence(logits, draft_probs)
                if confidence < self.p_min or (stop is not None and not stop.keep(i, confidence)):
                    break
                confidences.append(confidence)
            best_two = self.draft_ids[logits.topk(2).indices]  # [2]: the first and second choice
            runners_up.append(best_two)
            if greedy:
                token = best_two[0]  # []
            else:
                full = torch.zeros(self.target_vocab_size, device=self.device)  # [V], zero outside the N ids
                full[self.draft_ids] = draft_probs
                if self.noise is not None:  # seeded: the race the target samples this index with
                    from engine.decoding.sampling import coupled_sample

                    token = coupled_sample(full, self.noise.race(len(context) + i, 1, full.numel())[0])
                else:
                    token = self.draft_ids[sample(draft_probs, self.generator)]
                probs.append(full)
            tokens.append(token)
            if i + 1 < k and (stop is None or stop.go_on(i)):
                self._check_cancel()
                out = self._step(out.view(1, -1), token.view(1), position + 1 + i)[-1]
                logits = self.head.logits(out)
            else:
                break
        self._drafted = len(tokens)
        self.last_confidences = confidences
        self._runners_up = runners_up
        if not tokens:
            return empty_draft(self.target_vocab_size, self.device, catch_up_s)
        return Draft(torch.stack(tokens), torch.stack(probs) if probs else None, catch_up_s)

    def tree(self, context: list[int], draft: list[int], budget: int):
        """The draft, plus at each depth the head's best other token as a leaf, shallowest first
        (the likeliest to be reached), within `budget` nodes."""
        from engine.decoding.tree import DraftTree

        if not draft or budget <= len(draft):
            return None
        tree = DraftTree.chain(draft)
        choices = torch.stack(self._runners_up[: len(draft)]).tolist()  # [depth, 2]
        for depth, (first, second) in enumerate(choices):
            if len(tree) >= budget:
                break
            tree.add(second if first == draft[depth] else first, depth - 1)
        return tree if len(tree) > len(draft) else None

    def update(self, accepted: list[int]) -> None:
        """Nothing to do: the next round's features overwrite the drafted entries."""

    # --- internals --------------------------------------------------------------------------------

    @torch.inference_mode()
    def _fold_pending(self) -> int:
        """Appends the observed features to the head's cache; returns how many rows it read."""
        read = 0
        for start, features, sequence in self._merged_pending():
            # entries before `start` stay only where they were computed on this same history
            keep = min(start, max(common_prefix_length(self.tokens, sequence) - 1, 0))
            self.valid[keep:] = False
            if start + features.size(0) > self.context_length:
                continue
            tokens = torch.tensor(sequence[start + 1 :], dtype=torch.long, device=self.device)
            hidden = self.head.fc(features.to(self.head.dtype)).unsqueeze(0)  # [1, n, C]
            out = self._step(hidden[0], tokens, start)  # [n, C]
            self._last = (start + features.size(0) - 1, out[-1])
            self.tokens = sequence
            read += features.size(0)
        self._pending = []
        return read

    def _merged_pending(self) -> list[tuple[int, Tensor, list[int]]]:
        """The pending features, each run of consecutive rounds joined into one entry: plain rounds
        add one row each, and one head forward over n rows costs about what a forward over one does."""
        merged: list[tuple[int, Tensor, list[int]]] = []
        for start, features, sequence in self._pending:
            if merged:
                first, rows, earlier = merged[-1]
                follows = start == first + rows.size(0) and sequence[: len(earlier)] == earlier
                if follows:
                    merged[-1] = (first, torch.cat([rows, features]), sequence)
                    continue
            merged.append((start, features, sequence))
        return merged

    def _step(self, hidden: Tensor, tokens: Tensor, start: int) -> Tensor:
        """One head forward over entries at positions start.. ([n, C] features, [n] tokens) -> out [n, C]."""
        n = tokens.numel()
        positions = self.slots[start : start + n]  # [n]
        cos, sin = (table[start : start + n] for table in self.rope_table)  # [n, D]
        embeds = self.embed_tokens(tokens).to(hidden.dtype)  # [n, C]
        q, k, v, residual = self.head.project(hidden[None], embeds[None], cos[None], sin[None])
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        self.valid[positions] = True
        window = start + n
        mask = self.valid[:window].unsqueeze(0) & (self.slots[:window].unsqueeze(0) <= positions.unsqueeze(1))
        if self.row_attention:
            attended = attend_rows(q[0].transpose(0, 1), self.k_cache, self.v_cache, None, mask)
            attended = attended.reshape(1, n, -1)  # [1, n, H*D]
        else:
            k, v = self.k_cache[:, :, :window], self.v_cache[:, :, :window]
            attended = self.head.attend(q, k, v, mask[None])
        return self.head.finish(attended, residual)[0]

    def _confidence(self, logits: Tensor, draft_probs: Tensor | None) -> float:
        """The top probability of the distribution the token is drawn from (T = 1 when greedy)."""
        probs = logits.float().softmax(-1) if draft_probs is None else draft_probs
        return float(probs.max())

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled


def acceptance_prior(training: dict) -> tuple[float, float] | None:
    """What adaptive K assumes of a head before measuring it: its top-1 agreement with the target at
    the first and second chained step, as its training measured them. A head's second token is about
    as likely as its first (0.57 against 0.62 for the shipped one), where a lookup match that was right
    once is usually right again; starting from the lookup prior, K went to 4 on every new reply."""
    steps = [float(p) for p in training.get("final_top1_by_step") or [] if 0.0 < float(p) < 1.0]
    if not steps:
        return None
    return steps[0], steps[1] if len(steps) > 1 else steps[0]


def head_drafter(
    target, runner, source=None, draft_vocab: int | None = None, quantize: bool = True
) -> HeadDrafter:
    """A HeadDrafter for `target` (a LoadedModel) on its runner: the head in folder `source`, or the
    one Tandem ships for this target. `draft_vocab` keeps only the N most frequent draft tokens, or
    widens the vocabulary to N with the target's own rows (DraftHead.widened). `quantize`: 8-bit
    blocks where they run and agree with float32 here (engine.heads.quant)."""
    from engine.heads import quant as head_quant
    from engine.heads.head import find_head, load_head
    from engine.runtime import row_linear

    folder = find_head(target, source)
    head = load_head(folder, target.model, device=runner.device)
    if draft_vocab and draft_vocab < head.config.draft_vocab_size:
        head = head.truncated(draft_vocab)
    elif draft_vocab:
        head = head.widened(draft_vocab, target.model.get_output_embeddings().weight)
    head.fuse_projections()
    weights = None
    if quantize:
        head, weights = head_quant.quantized_if_agrees(head, target)
    row_linear.use_in(head)  # the layers still in float32
    name = "head" if source is None else f"head:{folder.name}"
    return HeadDrafter(
        head, target.model.get_input_embeddings(), runner.vocab_size, runner.context_length, name, weights
    )
