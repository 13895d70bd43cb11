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
    from engine.cli.terminal import converse, visible
    from engine.remote.client import RemoteEngine

    remote = RemoteEngine(
        args.server, api_key_from_args(args), getattr(args, "server_model", None), sampling=sampling
    )
    remote.prepare()
    args.target = f"{remote.model_name} @ {remote.base_url}"  # what the stored conversation names

    def after_turn(finished):
        if finished.reason in ("interrupted", "error"):
            print(f"[{finished.reason}] {visible(finished.stats.note)}", file=sys.stderr)

    converse(
        args, args.target, recorder, lambda messages: functools.partial(remote.respond, messages), after_turn
    )
    remote.close()
    return 0
