"""tandem-cli: terminal commands. `chat` talks to a model, `models` lists them, `bench` measures."""

from __future__ import annotations

import argparse
import sys

from engine import __version__
from engine.errors import TandemError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem-cli", description="Tandem: fast, lossless local LLM chat.")
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)

    from engine.cli.bench import add_bench_parser
    from engine.cli.chat import add_chat_parser
    from engine.cli.models import add_models_parser
    from engine.cli.quant_report import add_quant_report_parser
    from engine.cli.serve import add_serve_parser
    from engine.cli.train_head import add_train_head_parser
    from engine.cli.transfer import add_export_parser, add_import_parser

    add_chat_parser(subparsers)
    add_models_parser(subparsers)
    add_bench_parser(subparsers)
    add_quant_report_parser(subparsers)
    add_export_parser(subparsers)
    add_import_parser(subparsers)
    add_train_head_parser(subparsers)
    add_serve_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except TandemError as exc:
        from engine.cli.terminal import visible

        print(f"tandem: {visible(str(exc))}", file=sys.stderr)  # it may quote a server's message
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
