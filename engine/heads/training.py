"""Training a draft head by self-distillation: the target writes the answers, the head learns its next-token
distributions from the target's own hidden states.

Two stages, saved under `<out>/work/` so an interrupted run resumes where it stopped:

1. answers:  the target answers generated instructions (engine.heads.prompts), batched;
   while it generates, forward hooks keep the hidden states the head reads (no second pass); the
   target's probability mass per token over the answers picks the draft vocabulary (N ids);
2. training: the head predicts, at every position, the target's distribution over the draft
             vocabulary (cross-entropy to the target's renormalised distribution = KL up to a
             constant), for `steps` chained steps: step j feeds the head its own outputs for the
             last j positions, exactly as drafting does (EAGLE-3's training-time test).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.errors import SettingsError
from engine.heads.head import DraftHead, HeadConfig, head_rows, load_head, save_head, target_fingerprint


@dataclass
class TrainRecipe:
    prompts: int = 384
    answer_tokens: int = 128
    generate_batch: int = 32
    draft_vocab: int = 8192
    steps: int = 3  # chained drafting steps trained (1: teacher forcing only)
    step_decay: float = 0.8  # weight of step j's loss: decay**j
    epochs: int = 4
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 50
    temperature: float = 0.7  # half the answers are sampled at this temperature, half greedy
    # of the prompts: work on a text the target wrote first (engine.heads.passages)
    written_share: float = 0.0
    # of the prompts: questions and requests the target writes itself, in the voice of a user
    asked_share: float = 0.0
    seed: int = 0
    checkpoint_every: int = 100


def _progress(iterable=None, total=None, desc=""):
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="it", dynamic_ncols=True)


# --- 1-2. answers and features -------------------------------------------------------------------


class FeatureTap:
    """Forward hooks that keep the target's hidden states while it generates: the input of layer i
    for i < num_layers, and the final normed output for i = num_layers (transformers' numbering)."""

    def __init__(self, model, layers: list[int]):
        self.layers = layers
        self.pieces: dict[int, list[torch.Tensor]] = {
            i: [] for i in {*layers, model.config.num_hidden_layers}
        }
        n = model.config.num_hidden_layers
        blocks = model.model.layers
        self.handles = []
        for i in self.pieces:
            if i < n:
                self.handles.append(blocks[i].register_forward_pre_hook(self._keep_input(i)))
            else:
                self.handles.append(model.model.norm.register_forward_hook(self._keep_output(i)))
        self.final = n

    def _keep_input(self, i):
        def hook(module, args):
            self.pieces[i].append(args[0].detach().to("cpu", torch.float16))

        return hook

    def _keep_output(self, i):
        def hook(module, args, output):
            self.pieces[i].append(output.detach().to("cpu", torch.float16))

        return hook

    def take(self) -> dict[int, torch.Tensor]:
        """[B, prompt width + steps, C] per index, and clears."""
        taken = {i: torch.cat(p, dim=1) for i, p in self.pieces.items() if p}
        for p in self.pieces.values():
            p.clear()
        return taken

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


@torch.inference_mode()
def generate_answers(
    loaded, prompts: list[list[int]], recipe: TrainRecipe, layers, device, work: Path
) -> dict:
    """The target answers every prompt, batched, keeping its hidden states on the way (no second pass).

    Each batch is saved as work/answers-NNNN.pt, so an interrupted run resumes. Returns the lists
    ids (prompt + answer, minus the last token, whose features were never computed), prompt_lengths,
    features [n, F*C] and finals [n, C] (float16).
    """
    model, tokenizer = loaded.model, loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = sorted(loaded.eos_token_ids)
    # prompts of like length share a batch: less padding, and each batch's answers end closer together
    by_length = sorted(prompts, key=len)
    batches = [
        by_length[i : i + recipe.generate_batch] for i in range(0, len(by_length), recipe.generate_batch)
    ]
    tap = FeatureTap(model, layers)
    bar = _progress(total=len(prompts), desc="target writes answers")
    data = {"ids": [], "prompt_lengths": [], "features": [], "finals": []}
    try:
        for number, batch in enumerate(batches):
            path = work / f"answers-{number:04d}.pt"
            if not path.exists():
                torch.save(_answer_batch(model, tap, batch, recipe, number, pad, eos, device), path)
            part = torch.load(path)
            for key in data:
                data[key].extend(part[key])
            bar.update(len(batch))
    finally:
        tap.close()
        bar.close()
    return data


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one batch for generate: ids and attention mask, [B, longest]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def _answer_batch(model, tap, batch, recipe, number, pad, eos, device) -> dict:
    ids, mask = left_padded(batch, pad)
    width = ids.size(1)
    sampled = number % 2 == 1  # every other batch sampled, the rest greedy
    tap.take()
    generated = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=recipe.answer_tokens,
        do_sample=sampled,
        temperature=recipe.temperature if sampled else None,
        top_p=None,
        top_k=None,
        pad_token_id=pad,
        eos_token_id=eos,
    )[:, width:].tolist()
    hidden = tap.take()  # [B, width + steps, C] per layer index
    part = {"ids": [], "prompt_lengths": [], "features": [], "finals": []}
    for row, (prompt, answer) in enumerate(zip(batch, generated, strict=True)):
        stop = next((i for i, t in enumerate(answer) if t in eos), None)
        answer = answer[: stop + 1] if stop is not None else answer
        sequence = list(prompt) + answer
        n = len(sequence) - 1  # positions whose features the target computed
        first = width - len(prompt)
        part["ids"].append(sequence[:n])
        part["prompt_lengths"].append(len(prompt))
        part["features"].append(torch.cat([hidden[i][row, first : first + n] for i in tap.layers], dim=-1))
        part["finals"].append(hidden[tap.final][row, first : first + n].clone())
    return part


@torch.no_grad()
def soft_counts(finals: list[torch.Tensor], prompt_lengths: list[int], lm_head) -> torch.Tensor:
    """The target's probability mass per token id over answer positions: [V] float64. `lm_head`: the
    target's output layer (a float Linear, or one on a GGUF file's own blocks)."""
    counts = torch.zeros(lm_head.out_features, dtype=torch.float64)
    device = next(itertools.chain(lm_head.parameters(), lm_head.buffers())).device
    with torch.no_grad():
        for hidden, start in zip(finals, prompt_lengths, strict=True):
            rows = hidden[max(start - 1, 0) :].to(device, torch.float32)
            if rows.numel():
                counts += lm_head(rows).float().softmax(-1).sum(0).double().cpu()
    return counts


def choose_vocabulary(soft_counts: torch.Tensor, sequences, size: int, always: set[int]) -> torch.Tensor:
    """The `size` target ids with the most probability mass (plus hard counts), end tokens always in,
    most frequent first (FR-Spec's frequency ranking)."""
    counts = soft_counts.clone()
    for sequence in sequences:
        counts.index_add_(
            0, torch.tensor(sequence, dtype=torch.long), torch.ones(len(sequence), dtype=counts.dtype)
        )
    for token in always:
        counts[token] = float("inf")
    size = min(size, counts.numel())
    return torch.topk(counts, size).indices  # most frequent first: a prefix is a smaller vocabulary


# --- 3. training ---------------------------------------------------------------------------------


def chained_log_probs(head: DraftHead, embed, ids: torch.Tensor, features: torch.Tensor, steps: int):
    """The head's log-probabilities over its vocabulary for `steps` chained steps: list of [B, L, N].

    ids [B, T], features [B, T, F*C]; L = T - 1. Entry t reads features t and token t+1 and scores
    token t+2. At step j, entry t is what drafting computes j tokens past the target's last features:
    the true entries up to t - j, then one entry of each earlier step, each fed the previous step's
    output (EAGLE-3's training-time test, with the matching attention mask).
    """
    B, T = ids.shape
    L = T - 1
    dtype = head.dtype
    embeds = embed(ids[:, 1:]).to(dtype)  # [B, L, C]
    positions = torch.arange(L, device=ids.device)
    cos, sin = head.rope(positions)  # [L, D]
    slots, rows = positions.unsqueeze(0), positions.unsqueeze(1)  # [1, L], [L, 1]
    keys, values, outputs = [], [], []
    hidden = head.fc(features[:, :L].to(dtype))  # [B, L, C]
    for step in range(steps):
        q, k, v, residual = head.project(hidden, embeds, cos, sin)
        keys.append(k)
        values.append(v)
        # step 0's entries up to t - step, then one entry of each later step on the diagonal
        blocks = [slots <= rows - step] + [slots == rows - step + i for i in range(1, step + 1)]
        mask = torch.cat(blocks, dim=1).unsqueeze(0)  # [1, L, (step+1) L]
        # rows t < step have no valid keys in block 0 but always their own diagonal entry
        attended = head.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask)
        out = head.finish(attended, residual)  # [B, L, C]
        outputs.append(head.logits(out).float().log_softmax(-1))
        # the next step reads, at position t, this step's output at t-1
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    return outputs


def chained_loss(head: DraftHead, embed, batch: dict, teacher_head: torch.Tensor, recipe: TrainRecipe):
    """Cross-entropy to the target's renormalised draft-vocabulary distribution (KL up to a constant),
    summed over the chained steps with weights decay**j; also each step's top-1 agreement.

    batch: ids [B, T], features [B, T, F*C], finals [B, T, C], weight [B, T] (1 at entry t where the
    token it scores, t+2, is trained on).
    """
    ids, weight = batch["ids"], batch["weight"]
    L = ids.size(1) - 1
    with torch.no_grad():
        teacher_logits = (
            batch["finals"][:, 1:].to(teacher_head.dtype) @ teacher_head.T
        )  # [B, L, N]: target at t+1
        teacher = teacher_logits.float().softmax(-1)
    total, weights, accuracy = 0.0, 0.0, []
    for step, log_probs in enumerate(chained_log_probs(head, embed, ids, batch["features"], recipe.steps)):
        valid = weight[:, :L].clone()
        valid[:, :step] = 0
        loss = -(teacher * log_probs).sum(-1)  # [B, L]
        step_weight = recipe.step_decay**step
        total = total + step_weight * (loss * valid).sum() / valid.sum().clamp(min=1)
        weights += step_weight
        with torch.no_grad():
            hit = (log_probs.argmax(-1) == teacher.argmax(-1)).float()
            accuracy.append(float((hit * valid).sum() / valid.sum().clamp(min=1)))
    return total / weights, accuracy


def make_batches(data: dict, recipe: TrainRecipe, rng: random.Random) -> list[list[int]]:
    order = sorted(range(len(data["ids"])), key=lambda i: len(data["ids"][i]))
    batches = [order[i : i + recipe.batch] for i in range(0, len(order), recipe.batch)]
    rng.shuffle(batches)
    return batches


def collate(data: dict, rows: list[int], device) -> dict:
    width = max(len(data["ids"][i]) for i in rows)
    B = len(rows)
    F_dim = data["features"][rows[0]].size(-1)
    C = data["finals"][rows[0]].size(-1)
    ids = torch.zeros((B, width), dtype=torch.long)
    features = torch.zeros((B, width, F_dim), dtype=torch.float16)
    finals = torch.zeros((B, width, C), dtype=torch.float16)
    weight = torch.zeros((B, width))
    for r, i in enumerate(rows):
        n = len(data["ids"][i])
        ids[r, :n] = torch.tensor(data["ids"][i])
        features[r, :n] = data["features"][i]
        finals[r, :n] = data["finals"][i]
        # the head at entry t scores token t+2: train where that token is part of the answer
        weight[r, max(data["prompt_lengths"][i] - 2, 0) : n - 1] = 1
    return {
        "ids": ids.to(device),
        "features": features.to(device),
        "finals": finals.to(device),
        "weight": weight.to(device),
    }


def new_head(loaded, vocabulary: torch.Tensor, layers: list[int], seed: int) -> DraftHead:
    torch.manual_seed(seed)
    config = HeadConfig.for_target(loaded.model.config, int(vocabulary.numel()), layers)
    head = DraftHead(config)
    for parameter in head.parameters():
        if parameter.dim() == 2:
            torch.nn.init.normal_(parameter, std=0.02)
    with torch.no_grad():
        head.norm.weight.copy_(loaded.model.model.norm.weight.float().cpu())  # the lm_head slice expects it
    head.set_vocabulary(vocabulary)
    return head


def train_head(
    loaded,
    out: Path,
    recipe: TrainRecipe,
    prompts: list[list[int]],
    device,
    layers: list[int] | None = None,
    log=print,
    init_from: Path | None = None,
) -> dict:
    """Runs (or resumes) the stages and writes the head to `out`; returns the training record.
    `init_from`: a head folder for this target to go on training instead of a new head."""
    out = Path(out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    model = loaded.model.to(device).eval()
    layers = layers or [model.config.num_hidden_layers]
    cost = json.loads((work / "cost.json").read_text()) if (work / "cost.json").exists() else {}

    def save_cost():
        (work / "cost.json").write_text(json.dumps(cost, indent=1))

    began = time.perf_counter()
    data = generate_answers(loaded, prompts, recipe, layers, device, work)
    sequences, prompt_lengths = data["ids"], data["prompt_lengths"]
    cost.setdefault("answers_s", time.perf_counter() - began)
    cost["tokens_generated"] = sum(len(s) + 1 - p for s, p in zip(sequences, prompt_lengths, strict=True))
    save_cost()
    counts = soft_counts(data["finals"], prompt_lengths, model.get_output_embeddings())
    answers = [s[p:] for s, p in zip(sequences, prompt_lengths, strict=True)]
    if init_from is None:
        vocabulary = choose_vocabulary(counts, answers, recipe.draft_vocab, loaded.eos_token_ids)
        head = new_head(loaded, vocabulary, layers, recipe.seed).to(device)
    else:  # further training of a head: its weights, layers and vocabulary
        head = load_head(init_from, model, device=device, dtype=torch.float32).train()
        if list(head.config.target_layers) != list(layers):
            raise SettingsError(
                f"The head in {init_from} reads layers {head.config.target_layers}, not {layers}."
            )
        vocabulary = head.draft_ids.cpu()
        started_from = dict(head.config.training or {})
    embed = model.get_input_embeddings()
    teacher_head = head_rows(model.get_output_embeddings(), vocabulary, init_from).to(device)  # [N, C]
    head.lm_head.weight.data = teacher_head.clone()
    head.lm_head.weight.requires_grad_(False)  # the target's rows, not trained (not stored)
    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=recipe.lr, weight_decay=0.0)
    rng = random.Random(recipe.seed)
    per_epoch = math.ceil(len(sequences) / recipe.batch)
    total_steps = per_epoch * recipe.epochs

    warmup = min(recipe.warmup, max(total_steps // 10, 1))

    def lr_at(step):
        if step < warmup:
            return recipe.lr * (step + 1) / warmup
        progress = (step - warmup) / max(total_steps - warmup, 1)
        return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))

    step = 0
    checkpoint = work / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        rng.setstate(state["rng"])
    plan = [make_batches(data, recipe, random.Random(recipe.seed + e)) for e in range(recipe.epochs)]
    flat = [rows for epoch in plan for rows in epoch]
    bar = _progress(total=total_steps, desc="training the head")
    bar.update(step)
    began = time.perf_counter()
    trained_tokens = 0
    head.train()
    accuracy = []
    while step < total_steps:
        batch = collate(data, flat[step], device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss, accuracy = chained_loss(head, embed, batch, teacher_head, recipe)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        trained_tokens += int(batch["weight"].sum())
        step += 1
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1="/".join(f"{a:.2f}" for a in accuracy))
        bar.update(1)
        if step % recipe.checkpoint_every == 0 or step == total_steps:
            torch.save(
                {
                    "head": head.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "rng": rng.getstate(),
                },
                checkpoint,
            )
    bar.close()
    cost["train_s"] = cost.get("train_s", 0.0) + time.perf_counter() - began
    cost["tokens_trained"] = (
        sum(max(len(s) - max(p - 2, 0) - 1, 0) for s, p in zip(sequences, prompt_lengths, strict=True))
        * recipe.epochs
    )
    save_cost()

    head.eval()
    head.config.base_model = {
        "name": loaded.name,
        "spec": loaded.spec,
        "fingerprint": target_fingerprint(model),
    }
    head.config.training = {
        "recipe": asdict(recipe),
        "prompts": len(sequences),
        "tokens_generated": cost["tokens_generated"],
        "tokens_trained": cost["tokens_trained"],
        "wall_s": round(
            sum(cost.get(part, 0) for part in ("texts_s", "questions_s", "answers_s", "train_s")), 1
        ),
        "device": str(device),
        "final_top1_by_step": [round(a, 3) for a in accuracy],
    }
    if init_from is not None:
        head.config.training["started_from"] = {"folder": Path(init_from).name, "training": started_from}
    save_head(head, out)
    return head.config.training
