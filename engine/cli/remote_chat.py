"""`tandem-cli chat --server URL`: the terminal chat, answered by a server through RemoteEngine.

The conversation is stored exactly as a local one (`--db`), its target named after the server and the
model that answered; a reply whose stream broke off is stored as 'interrupted' with its text so far.
"""

from __future__ import annotations

import functools
import os
import sys

from engine.errors import SettingsError
from engine.settings import SamplingSettings


def api_key_from_args(args) -> str | None:
    """--api-key-env NAME reads the key from that variable; else a key saved for this server, if any."""
    if getattr(args, "api_key_env", None):
        key = os.environ.get(args.api_key_env)
        if not key:
            raise SettingsError(f"The environment variable {args.api_key_env} holds no API key.")
        return key
    from engine.remote.client import normalize_base_url
    from engine.remote.credentials import load_api_key

    return load_api_key(normalize_base_url(args.server))


def run_remote_chat(args, sampling: SamplingSettings, recorder) -> int:
    """The chat loop of engine.cli.chat against a server; `recorder` is its ConversationRecorder or None."""
    from engine.cli.terminal import TerminalPrinter, answer_turn, checked_text, format_stats, read_line
    from engine.remote.client import RemoteEngine

    remote = RemoteEngine(
        args.server, api_key_from_args(args), getattr(args, "server_model", None), sampling=sampling
    )
    remote.prepare()
    args.target = f"{remote.model_name} @ {remote.base_url}"  # what the stored conversation names
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    printer = TerminalPrinter()
    interactive = args.message is None
    if interactive:
        print(f"Tandem chat with {args.target}. Empty line or Ctrl+D to quit.", file=sys.stderr)
    while True:
        if interactive:
            line = read_line()
            text = checked_text(line.strip(), "The message") if line is not None else ""
            if not text:
                break
        else:
            text = args.message
        messages.append({"role": "user", "content": text})
        finished = answer_turn(
            printer,
            recorder,
            text,
            functools.partial(remote.respond, messages),
        )
        messages.append({"role": "assistant", "content": finished.text})
        if finished.reason in ("interrupted", "error"):
            print(f"[{finished.reason}] {finished.stats.note}", file=sys.stderr)
        if args.stats:
            print(format_stats(finished), file=sys.stderr)
        if not interactive:
            break
    remote.close()
    return 0
