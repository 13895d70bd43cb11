"""`tandem-cli models [--target SPEC] [--local PATH ...] [--json]`: known models, and which can draft."""

from __future__ import annotations

import argparse
import json

from engine.models.catalog import CatalogEntry, drafts_for, list_models


def add_models_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("models", help="list known models and which can draft for a target")
    parser.add_argument("--target", metavar="SPEC", help="show which models can draft for this target")
    parser.add_argument(
        "--local", metavar="PATH", action="append", default=[], help="also list this model folder or .gguf"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run_models)
    return parser


def _size(entry: CatalogEntry) -> str:
    if entry.size_bytes:
        return (
            f"{entry.size_bytes / 1024**3:.2f} GB"
            if entry.size_bytes >= 1024**3
            else f"{entry.size_bytes / 1024**2:.0f} MB"
        )
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


def run_models(args) -> int:
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
