"""`tandem-cli train-head --target SPEC --out DIR`: train a draft head for a target by self-distillation.

The target answers generated instructions itself, then a one-layer head learns its next-token
distributions from its hidden states. Interrupted runs resume from `DIR/work/`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.errors import SettingsError


def add_train_head_parser(subparsers) -> argparse.ArgumentParser:
    from engine.heads.training import TrainRecipe

    defaults = TrainRecipe()
    parser = subparsers.add_parser("train-head", help="train a draft head for a target (self-distillation)")
    parser.add_argument("--target", required=True, metavar="SPEC", help="the model the head drafts for")
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder for the head (and work/ to resume)"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--dtype", default="float32", help="target dtype while training (default float32)")
    parser.add_argument(
        "--prompts", type=int, default=defaults.prompts, help="instructions the target answers"
    )
    parser.add_argument("--answer-tokens", type=int, default=defaults.answer_tokens, help="longest answer")
    parser.add_argument(
        "--draft-vocab", type=int, default=defaults.draft_vocab, help="draft vocabulary size N"
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="chained drafting steps trained")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--layers", default="", help="target hidden states read, e.g. 2,15,27 (default: the last)"
    )
    parser.add_argument(
        "--written-share",
        type=float,
        default=defaults.written_share,
        help="share of the prompts that work on a text the target writes first (default %(default)s)",
    )
    parser.add_argument(
        "--asked-share",
        type=float,
        default=defaults.asked_share,
        help="share of the prompts that the target writes itself as a user would (default %(default)s)",
    )
    parser.add_argument(
        "--generate-batch",
        type=int,
        default=defaults.generate_batch,
        help="answers the target writes at once (larger on a GPU; default %(default)s)",
    )
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="DIR",
        help="go on training this head (for the same target) instead of a new one: its vocabulary stays",
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.set_defaults(handler=run_train_head)
    return parser


def run_train_head(args) -> int:
    import torch

    from engine.heads.data import training_prompts
    from engine.heads.training import TrainRecipe, train_head
    from engine.models.loaded import resolve_device
    from engine.models.loading import load_model

    for name in ("written_share", "asked_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SettingsError(
                f"--{name.replace('_', '-')} must be between 0 and 1, not {getattr(args, name)}."
            )
    if args.written_share + args.asked_share > 1.0:
        raise SettingsError("--written-share and --asked-share together must not exceed 1.")
    for name in ("prompts", "answer_tokens", "draft_vocab", "epochs", "steps", "batch", "generate_batch"):
        if getattr(args, name) < 1:
            raise SettingsError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}.")
    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        raise SettingsError(f"--layers takes comma-separated layer numbers, not {args.layers!r}.") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    recipe = TrainRecipe(
        prompts=args.prompts,
        answer_tokens=args.answer_tokens,
        draft_vocab=args.draft_vocab,
        epochs=args.epochs,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        written_share=args.written_share,
        asked_share=args.asked_share,
        generate_batch=args.generate_batch,
    )
    loaded = load_model(args.target, device=str(device), dtype=args.dtype)
    n_layers = loaded.model.config.num_hidden_layers
    if any(not 0 <= layer <= n_layers for layer in layers):
        raise SettingsError(f"--layers must be between 0 and {n_layers} for {loaded.name}.")
    init_from = None
    if args.init_from:  # refused now, with a clear message, rather than after the answers
        from engine.heads.head import find_head, load_head

        init_from = find_head(loaded, args.init_from)
        layers = layers or list(load_head(init_from, loaded.model).config.target_layers)
    began = time.perf_counter()
    prompts = training_prompts(loaded, recipe, device, Path(args.out) / "work")
    record = train_head(loaded, Path(args.out), recipe, prompts, device, layers or None, init_from=init_from)
    record["this_run_wall_s"] = round(time.perf_counter() - began, 1)
    print(json.dumps(record, indent=1))
    print(f"Draft head written to {args.out}")
    return 0
