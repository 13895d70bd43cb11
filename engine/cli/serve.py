"""`tandem-cli serve`: Tandem's engine as an OpenAI-compatible HTTP server.

Binds 127.0.0.1 unless told otherwise; any other address needs an API key (--api-key or
--api-key-env), so the engine is never open to a network by accident. Without a key, it answers only
requests addressed to this computer (the bound address, localhost, a loopback address, or a name given
with --allow-host), and web pages of other origins cannot use it unless --cors-origin names them
(engine.server.guard). `--port 0` takes a free port; the address actually bound is printed as
`Listening on http://HOST:PORT` once requests are accepted.
"""

from __future__ import annotations

import os
import sys

from engine.errors import SettingsError
from engine.settings import check_context


def add_serve_parser(subparsers) -> None:
    from engine.cli.chat import add_context_option, add_model_options, add_trees_option

    parser = subparsers.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_options(parser)
    add_context_option(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this computer only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    parser.add_argument("--api-key", default=None, help="key clients must send (required off the loopback)")
    parser.add_argument("--api-key-env", default=None, help="read the API key from this environment variable")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to this host name (without an API key, only the bound "
        "address, localhost and loopback addresses are answered); repeat for several",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from this origin (such as http://localhost:3000) use the server; "
        "repeat for several (default: none, so no web page can)",
    )
    parser.add_argument(
        "--model-name", default=None, help="the model id clients ask for (default: the target spec)"
    )
    parser.add_argument("--max-queue", type=int, default=4, help="requests that may wait; more get 503")
    parser.add_argument("--k", default="adaptive", help="'adaptive' or a fixed draft length 1-16")
    parser.add_argument("--max-k", type=int, default=8)
    add_trees_option(parser)
    parser.add_argument("--temperature", type=float, default=0.0, help="default for requests that give none")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=512, help="default max_tokens")
    parser.add_argument("--seed", type=int, default=None)
    parser.set_defaults(handler=run_serve)


def resolve_api_key(args) -> str | None:
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise SettingsError(f"The environment variable {args.api_key_env} holds no API key.")
        return key
    return args.api_key or None


def build_serving_engine(args, speculation, sampling):
    """The ChatEngine to serve; an n-gram or plain server loads no draft model."""
    from engine.cli.chat import ProgressBar, draft_spec_for
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    draft_spec = draft_spec_for(args, speculation)
    precision = getattr(args, "precision", None)  # --precision, where the model options offer it
    extra = {"target_precision": precision} if precision else {}
    check_context(args.context)
    progress = ProgressBar()
    try:
        target, draft = load_pair(
            args.target, draft_spec, quantization=args.quant, device=args.device, progress=progress, **extra
        )
    finally:
        progress.close()
    engine = ChatEngine(
        target,
        draft,
        speculation=speculation,
        sampling=sampling,
        compiled=args.compiled,
        remember_drafters=True,
        context=args.context,
    )
    progress = ProgressBar()
    try:
        engine.prepare(progress)
    finally:
        progress.close()
    # a server lives long: its CPU compiled path is built beside the requests, as in the app
    engine.optimize_in_background(on_done=lambda message: print(message, file=sys.stderr, flush=True))
    return engine


def run_serve(args) -> int:
    import uvicorn

    from engine.cli.chat import sampling_from_args, speculation_from_args
    from engine.server.app import create_app
    from engine.server.connections import server_config
    from engine.server.guard import checked_origin
    from engine.server.listen import bind_socket, check_bind

    api_key = resolve_api_key(args)
    check_bind(args.host, api_key)
    cors_origins = [checked_origin(origin) for origin in args.cors_origin]
    if args.max_queue < 1:
        raise SettingsError(f"--max-queue must be at least 1, not {args.max_queue}.")
    speculation = speculation_from_args(args)
    sampling = sampling_from_args(args)
    sock = bind_socket(args.host, args.port)  # before loading, so a taken port fails fast
    engine = build_serving_engine(args, speculation, sampling)
    app = create_app(
        engine,
        args.model_name or args.target,
        api_key=api_key,
        max_queue=args.max_queue,
        defaults=sampling,
        context_length=getattr(engine, "context_length", None),
        bound_host=args.host,
        allow_hosts=args.allow_host,
        cors_origins=cors_origins,
    )
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            print(f"Listening on http://{shown}:{port}", flush=True)

    config = server_config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    print(f"Serving {args.model_name or args.target} (drafter: {speculation.drafter}).", file=sys.stderr)
    Server(config).run(sockets=[sock])
    return 0
