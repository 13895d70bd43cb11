"""`tandem-cli models [--target SPEC] [--local PATH ...] [--json]`: known models, and which can draft;
`tandem-cli models --hub owner/repo [--context N]`: a hub repository's GGUF files, their quantization,
size and whether each fits here (load one with `--target owner/repo:QUANT`)."""

from __future__ import annotations

import argparse
import json

from engine.models.catalog import CatalogEntry, drafts_for, list_models
from engine.models.gguf_hub import DEFAULT_CONTEXT


def add_models_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("models", help="list known models and which can draft for a target")
    parser.add_argument("--target", metavar="SPEC", help="show which models can draft for this target")
    parser.add_argument(
        "--local", metavar="PATH", action="append", default=[], help="also list this model folder or .gguf"
    )
    parser.add_argument(
        "--hub", metavar="OWNER/REPO", help="list a hub repository's GGUF files: quantization, size, fit"
    )
    parser.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help=f"tokens of context the fit is judged at (--hub; default {DEFAULT_CONTEXT})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run_models)
    return parser


def _bytes(size: int) -> str:
    return f"{size / 1024**3:.2f} GB" if size >= 1024**3 else f"{size / 1024**2:.0f} MB"


def _size(entry: CatalogEntry) -> str:
    if entry.size_bytes:
        return _bytes(entry.size_bytes)
    if entry.params:
        return f"{entry.params / 1e9:.2f} B params"
    return "?"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run_hub(repo: str, context: int, as_json: bool) -> int:
    from engine.errors import SettingsError
    from engine.models import gguf_hub

    if context < 1:
        raise SettingsError(f"--context must be a positive number of tokens, not {context}.")
    files = gguf_hub.list_gguf_files(repo)
    kv_per_token = gguf_hub.remote_kv_bytes_per_token(max(files, key=lambda f: f.size_bytes))
    rows, payload = [], []
    for entry in files:
        estimate = gguf_hub.file_fit(entry.size_bytes, kv_per_token, context)
        verdict = "split: merge first" if entry.split else estimate.verdict
        payload.append(
            {
                "spec": f"{repo}:{entry.quant}",
                "files": list(entry.files),
                "quant": entry.quant,
                "size_bytes": entry.size_bytes,
                "sha256": list(entry.sha256),
                "needs_bytes": estimate.total_bytes,
                "kv_cache_known": kv_per_token is not None,
                "free_bytes": estimate.available["cpu"],
                "context": context,
                "fit": verdict,
            }
        )
        rows.append(
            [entry.quant, _bytes(entry.size_bytes), _bytes(estimate.total_bytes), verdict, entry.name]
        )
    if as_json:
        print(json.dumps({"repo": repo, "files": payload}, indent=2))
        return 0
    free = _bytes(payload[0]["free_bytes"]) if payload else "?"
    kv_note = "" if kv_per_token is not None else "; KV cache unknown, weights only"
    print(f"{repo}: GGUF files at {context:,} tokens of context ({free} free here{kv_note})")
    print(_table(rows, ["quant", "size", "needs", "fits", "file"]))
    print(f"Load one with: tandem-cli chat --target {repo}:{files[0].quant}")
    return 0


def run_models(args) -> int:
    if args.hub:
        return run_hub(args.hub, args.context, args.json)
    entries = list_models(local_paths=args.local)
    if args.target:
        results = drafts_for(args.target, entries)
        if args.json:
            payload = [
                {**entry.to_dict(), "can_draft": ok, "reason": reason} for entry, ok, reason in results
            ]
            print(json.dumps({"target": args.target, "drafts": payload}, indent=2))
            return 0
        rows = [
            [entry.spec, "yes" if ok else "no", entry.source, _size(entry), reason]
            for entry, ok, reason in results
        ]
        print(f"Drafts for {args.target}:")
        print(_table(rows, ["model", "can draft", "source", "size", "why"]))
        return 0
    if args.json:
        print(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return 0
    rows = [
        [
            entry.spec,
            entry.source,
            _size(entry),
            entry.family or "?",
            "yes" if entry.available_locally else "no",
        ]
        for entry in entries
    ]
    print(_table(rows, ["model", "source", "size", "tokenizer family", "on disk"]))
    return 0
