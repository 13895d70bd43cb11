"""`tandem-cli chat`: an interactive (or one-shot) chat in the terminal, streaming as it generates."""

from __future__ import annotations

import argparse
import sys
import threading

from engine.events import Event, Failed, Finished, TextPiece
from engine.models.builtin import DEFAULT_TARGET
from engine.settings import SamplingSettings, SpeculationSettings


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="built-in name, model folder, .gguf file or hub id")
    parser.add_argument(
        "--draft",
        default=None,
        help="draft model spec, 'ngram' or 'none' (default: a quantized copy of the target)",
    )
    parser.add_argument("--quant", choices=["none", "int8", "int4"], default="int8", help="draft quantization")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument(
        "--compiled",
        choices=["auto", "on", "off"],
        default="auto",
        help="compile the forwards: auto (on CUDA only), on (CPU too: minutes per shape), off",
    )


def add_chat_parser(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model in the terminal")
    add_model_options(parser)
    parser.add_argument("--k", default="adaptive", help="'adaptive' or a fixed draft length 1-16")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--message", default=None, help="answer this one message and exit")
    parser.add_argument("--stats", action="store_true", help="print acceptance and speed-up after each answer")
    parser.add_argument("--db", default=None, help="store the conversation in this SQLite file")
    parser.set_defaults(handler=run_chat)


def speculation_from_args(args) -> SpeculationSettings:
    from engine.errors import SettingsError

    draft = (args.draft or "").lower()
    drafter = "ngram" if draft == "ngram" else "none" if draft == "none" else "model"
    if args.k == "adaptive":
        k = None
    else:
        try:
            k = int(args.k)
        except ValueError:
            raise SettingsError(f"--k must be 'adaptive' or an integer from 1 to 16, not '{args.k}'.") from None
    settings = SpeculationSettings(drafter=drafter, k=k, max_k=args.max_k)
    settings.validate()
    return settings


def sampling_from_args(args) -> SamplingSettings:
    settings = SamplingSettings(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    settings.validate()
    return settings


class ProgressBar:
    """Shows preparation stages (conversion, download) as a tqdm bar on stderr."""

    def __init__(self) -> None:
        self._bar = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None or self._bar.total != total:
            self.close()
            self._bar = tqdm(total=total, file=sys.stderr, leave=False)
        self._bar.set_description(stage)
        self._bar.n = done
        self._bar.refresh()
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def build_engine(args, speculation: SpeculationSettings, sampling: SamplingSettings):
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    progress = ProgressBar()
    try:
        target, draft = load_pair(
            args.target,
            args.draft if speculation.drafter == "model" else None,
            quantization=args.quant,
            device=args.device,
            progress=progress,
        )
    finally:
        progress.close()
    engine = ChatEngine(target, draft, speculation=speculation, sampling=sampling, compiled=args.compiled)
    progress = ProgressBar()
    try:
        engine.prepare(progress)
    finally:
        progress.close()
    return engine


class TerminalPrinter:
    def __init__(self, stream=sys.stdout) -> None:
        self.stream = stream

    def __call__(self, event: Event) -> None:
        if isinstance(event, TextPiece):
            self.stream.write(event.text)
            self.stream.flush()
        elif isinstance(event, Failed):
            print(f"\n[error] {event.message}", file=sys.stderr)


def format_stats(finished: Finished) -> str:
    stats = finished.stats
    parts = [f"{stats.generated_tokens} tokens", f"drafter {stats.drafter}"]
    if stats.tokens_per_s:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
    if stats.mean_accepted_length is not None:
        parts.append(f"mean accepted length {stats.mean_accepted_length:.2f}")
    if stats.speedup is not None:
        parts.append(f"speed-up {stats.speedup:.2f}x vs target alone")
    if stats.note:
        parts.append(stats.note)
    return "[" + ", ".join(parts) + "]"


def run_chat(args) -> int:
    speculation = speculation_from_args(args)
    sampling = sampling_from_args(args)
    engine = build_engine(args, speculation, sampling)
    recorder = ConversationRecorder.open(args.db, args) if args.db else None
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    printer = TerminalPrinter()
    interactive = args.message is None
    if interactive:
        print(f"Tandem chat with {engine.target.spec}. Empty line or Ctrl+D to quit.", file=sys.stderr)
    while True:
        if interactive:
            try:
                text = input("\n> ").strip()
            except EOFError:
                break
            if not text:
                break
        else:
            text = args.message
        messages.append({"role": "user", "content": text})
        if recorder:
            recorder.user(text)
        cancel = threading.Event()
        try:
            finished = engine.respond(messages, on_event=printer, cancel=cancel)
        except KeyboardInterrupt:
            cancel.set()
            raise
        print()
        messages.append({"role": "assistant", "content": finished.text})
        if recorder:
            recorder.assistant(finished)
        if args.stats:
            print(format_stats(finished), file=sys.stderr)
        if not interactive:
            break
    return 0


class ConversationRecorder:
    """Stores a terminal conversation in the same SQLite store the app uses."""

    def __init__(self, store, conversation_id) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.last_id = None

    @classmethod
    def open(cls, db_path: str, args) -> ConversationRecorder:
        from engine.store.database import Store

        store = Store(db_path)
        title = (args.message or "Terminal chat")[:60]
        conversation_id = store.create_conversation(
            title=title,
            target=args.target,
            draft_settings={"draft": args.draft, "quant": args.quant, "k": args.k},
            system_prompt=args.system or "",
        )
        return cls(store, conversation_id)

    def user(self, text: str) -> None:
        self.last_id = self.store.add_message(self.conversation_id, "user", text, parent_id=self.last_id)

    def assistant(self, finished: Finished) -> None:
        status = "cancelled" if finished.reason == "cancelled" else "complete"
        self.last_id = self.store.add_message(
            self.conversation_id,
            "assistant",
            finished.text,
            parent_id=self.last_id,
            status=status,
            token_count=len(finished.token_ids),
            stats=finished.stats.to_dict(),
        )
