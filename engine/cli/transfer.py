"""`tandem-cli export` and `tandem-cli import`: conversations out to Markdown or JSON, and JSON back in.

Both use engine/store/export.py, the same code as the app's menus, so a file exported from either
imports into either. Export writes atomically; import is all or nothing per file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.errors import StorageError, TandemError
from engine.paths import default_db_path


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("export", help="export conversations to Markdown or JSON")
    parser.add_argument("--db", type=Path, default=None, help="conversation database (default: the app's)")
    parser.add_argument(
        "--format", choices=("markdown", "json"), default="json", help="file format (default json)"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="where to write the export")
    parser.add_argument(
        "--conversation",
        type=int,
        action="append",
        metavar="ID",
        help="export only this conversation (repeatable; default: every conversation)",
    )
    parser.set_defaults(handler=run_export)
    return parser


def add_import_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("import", help="import conversations from a Tandem JSON export")
    parser.add_argument("--db", type=Path, default=None, help="conversation database (default: the app's)")
    parser.add_argument("file", type=Path, nargs="+", metavar="FILE", help="a .json file written by export")
    parser.set_defaults(handler=run_import)
    return parser


def _open_existing(path: Path | None):
    from engine.store.database import Store

    path = path or default_db_path()
    if not path.exists():
        raise StorageError(f"There is no conversation database at {path}. Check --db.")
    return Store(path)


def run_export(args) -> int:
    from engine.store import export

    with _open_existing(args.db) as store:
        ids = args.conversation
        if ids:
            known = {c.id for c in store.list_conversations()}
            missing = [i for i in ids if i not in known]
            if missing:
                raise TandemError(
                    f"No conversation {missing[0]} in {store.path}. `tandem-cli export --format json` lists all."
                )
        writer = export.export_markdown if args.format == "markdown" else export.export_json
        path = writer(store, args.out, ids)
        count = len(ids) if ids else len(store.list_conversations())
    print(f"Exported {count} conversation{'s' * (count != 1)} to {path}")
    return 0


def run_import(args) -> int:
    from engine.store import export
    from engine.store.database import Store

    with Store(args.db or default_db_path()) as store:
        total = 0
        for path in args.file:
            if not path.is_file():
                raise StorageError(f"There is no file {path}.")
            ids = export.import_json(store, path)
            total += len(ids)
            print(f"Imported {len(ids)} conversation{'s' * (len(ids) != 1)} from {path}")
    return 0 if total or args.file else 2
