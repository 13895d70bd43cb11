"""Speculation at real sizes with a **simulated acceptance** (a bench mode: every figure it prints is
labelled a simulation).

Random-weight models have no real acceptance, so their drafts would never be kept. Here the drafter
runs its full real forward (a draft model file in its own blocks), and only then is each token it
proposed replaced: by the target's own greedy token at that position with probability α, by another
token otherwise. Everything else is the real loop: the verify forward, accept/reject, rollback and
adaptive K, with their real costs. The target's greedy tokens come from a first, plain run; greedy
output is the target's own whatever drafts, so every later context is a prefix of that run.

    python -m engine.bench.simulated --target 8b-Q4_K_M.gguf --draft 1b-Q4_K_M.gguf \
        --alphas 0.5,0.6,0.7,0.8 --tokens 64 --json simulated.json

Beside each measured speed-up it prints the bound from the measured costs: with per-token acceptance
α, K drafted tokens, a draft step c target steps and a verify of K + 1 tokens t(K+1) target steps, a
round emits E = (1 - α^(K+1)) / (1 - α) tokens at a cost of K·c + t(K+1), so the best K gives
max_K E / (K·c + t(K+1)) target-alone speed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.decoding.drafters.base import Draft

LABEL = "simulated acceptance"
PROMPT = "Explain, step by step, how a compiler turns source code into a program that runs."


@dataclass
class Simulation:
    """What replaces a drafter's tokens: `reference` (the prompt and the target's greedy reply) at
    rate `alpha`, another token otherwise."""

    reference: list[int]
    alpha: float
    vocab_size: int
    rng: random.Random
    offered: int = 0  # tokens replaced so far
    kept: int = 0  # of those, the target's own

    @property
    def realized(self) -> float | None:
        """The share of replaced tokens that were the target's own: α as this run drew it."""
        return self.kept / self.offered if self.offered else None

    def replace(self, context: list[int], tokens: torch.Tensor) -> torch.Tensor:  # [k] -> [k]
        out = tokens.clone()
        for i in range(out.numel()):
            position = len(context) + i
            own = self.reference[position] if position < len(self.reference) else None
            self.offered += 1
            if own is not None and self.rng.random() < self.alpha:
                out[i] = own
                self.kept += 1
            else:
                base = own if own is not None else int(out[i])
                out[i] = (base + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
        return out


_SIMULATED: dict[type, type] = {}


def _simulated_propose(self, context: list[int], k: int) -> Draft:
    draft = super(type(self), self).propose(context, k)  # the drafter's real forward, at its real cost
    tokens = self.simulation.replace(context, draft.tokens)
    return Draft(tokens, None, draft.catch_up_s)


def simulate_acceptance(drafter, simulation: Simulation):
    """`drafter` with its proposals replaced as `simulation` says (greedy replies only). Its class
    becomes a subclass of its own, so every capability the loop asks of it stays as it was."""
    base = type(drafter)
    if base not in _SIMULATED.values():
        cls = _SIMULATED.get(base)
        if cls is None:
            cls = _SIMULATED[base] = type(
                f"Simulated{base.__name__}", (base,), {"propose": _simulated_propose}
            )
        drafter.__class__ = cls
    drafter.simulation = simulation
    return drafter


def bound(alpha: float, draft_cost: float, verify_cost: dict[int, float]) -> tuple[float, int]:
    """(speed-up, K) at the best K: max over K of E(α, K) / (K·c + t(K+1)), costs in target steps."""
    best = (1.0, 0)
    for n, cost in verify_cost.items():
        k = n - 1
        if k < 1:
            continue
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        best = max(best, (tokens / (k * draft_cost + cost), k))
    return best


def measure_costs(engine, sizes=(1, 2, 3, 4, 5, 6, 7, 8, 9), repeats: int = 3):
    """Target verify costs t(n)/t(1), the draft model's step in target steps, and the target's step in
    seconds, all measured at this moment."""
    seconds = engine.measure_forwards(sizes, repeats)
    draft_s = engine.measure_forwards([1], repeats, draft=True).get(1, 0.0)
    return {n: seconds[n] / seconds[1] for n in seconds}, draft_s / seconds[1], seconds[1]


def run(
    target: Path, draft: Path, alphas: list[float], tokens: int, seed: int = 0, k: int | None = None
) -> dict:
    """The target alone, then the draft model at each α; `k` fixes K (None: adaptive K, as the app runs)."""
    from engine.models.loading import load_model
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    target_model, draft_model = load_model(str(target), device="cpu"), load_model(str(draft), device="cpu")
    engine = ChatEngine(target_model, draft_model, compiled="off")
    engine.remember_drafters = False
    engine.sampling = SamplingSettings(max_new_tokens=tokens)
    prompt = engine.prompt_ids([{"role": "user", "content": PROMPT}])

    def reply(drafter: str):
        engine.speculation = SpeculationSettings(drafter=drafter, k=k if drafter != "none" else None)
        engine.reset()
        engine.forget_history()
        started = time.perf_counter()
        finished = engine.generate_ids(prompt)
        return finished, time.perf_counter() - started

    reply("none")  # warm-up: kernels, caches, the first calibration
    plain, _ = reply("none")
    reference = list(prompt) + list(plain.token_ids)
    plain_decode = plain.stats.generated_tokens / max(
        plain.stats.total_time_s - plain.stats.prefill_time_s, 1e-9
    )
    verify_cost, draft_cost, step_s = measure_costs(engine)
    drafter = engine.model_drafter()
    vocab_size = len(target_model.tokenizer)
    rows = []
    for alpha in alphas:
        simulation = Simulation(reference, alpha, vocab_size, random.Random(seed))
        simulate_acceptance(drafter, simulation)
        finished, _ = reply("model")
        stats = finished.stats
        decode = stats.generated_tokens / max(stats.total_time_s - stats.prefill_time_s, 1e-9)
        speed_up_bound, best_k = bound(simulation.realized or alpha, draft_cost, verify_cost)
        rows.append(
            {
                "alpha": alpha,
                "alpha_realized": simulation.realized,
                "identical_to_target_alone": list(finished.token_ids) == list(plain.token_ids),
                "decode_tokens_per_s": decode,
                "speed_up": decode / plain_decode,
                "bound": speed_up_bound,
                "bound_k": best_k,
                "kept_per_drafted": stats.accepted / stats.drafted if stats.drafted else None,
                "tokens_per_round": stats.generated_tokens / stats.rounds if stats.rounds else None,
                "mean_k": sum(stats.k_history) / len(stats.k_history) if stats.k_history else 0.0,
            }
        )
        print(json.dumps({"label": LABEL, **rows[-1]}), flush=True)
    return {
        "label": LABEL,
        "target": target.name,
        "draft": draft.name,
        "threads": torch.get_num_threads(),
        "target_alone_decode_tokens_per_s": plain_decode,
        "target_step_s": step_s,
        "draft_step_cost": draft_cost,
        "verify_cost": verify_cost,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="the target's GGUF file")
    parser.add_argument("--draft", type=Path, required=True, help="a draft model's GGUF file")
    parser.add_argument("--alphas", default="0.5,0.6,0.7,0.8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=None, help="a fixed K (default: adaptive, as the app runs)")
    parser.add_argument("--llama-cpp", action="store_true", help="llama-bench on the target file too")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.target, args.draft, [float(a) for a in args.alphas.split(",")], args.tokens, k=args.k)
    if args.llama_cpp:
        from engine.bench.real_sizes import measure_llama_cpp

        result["llama_cpp"] = measure_llama_cpp(args.target, torch.get_num_threads())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
