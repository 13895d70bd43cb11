"""`tandem-cli chat`: an interactive (or one-shot) chat in the terminal, streaming as it generates."""

from __future__ import annotations

import argparse
import functools
import sys
import time

from engine.cli.terminal import check_terminal, checked_text, converse
from engine.errors import SettingsError
from engine.events import Finished
from engine.models.builtin import DEFAULT_TARGET
from engine.models.quantize import DRAFT_QUANTIZATIONS, PRECISIONS
from engine.settings import (
    DEFAULT_CONTEXT_TOKENS,
    NO_DRAFT,
    SamplingSettings,
    SpeculationSettings,
    check_context,
    needs_draft_model,
)


def add_model_options(parser: argparse.ArgumentParser, default_draft: str | None = "auto") -> None:
    """The model options; `default_draft`: what --draft is when not given (None: a quantized copy)."""
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="built-in name, model folder, .gguf file or hub id"
    )
    parser.add_argument(
        "--draft",
        default=default_draft,
        help="draft model spec, 'auto' (each round: lookup, suffix index, the draft head, a quantized "
        "copy, or none), 'ngram', 'suffix', 'head' (the draft head shipped for the target; head:DIR "
        "for another) or 'none' (default: "
        + (default_draft if default_draft else "a quantized copy of the target")
        + ")",
    )
    parser.add_argument(
        "--quant",
        choices=DRAFT_QUANTIZATIONS,
        default="auto",
        help="the quantized copy's quantization, for a float target (default auto: INT4 where the "
        "target's weights are 4-bit blocks already, else INT8); a GGUF target in its own blocks gets no copy",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the target's precision (default: on a CPU a GGUF runs in its file's own quantization and "
        "other models at fp32; bf16/fp16 on GPU); int8/int4 targets are checked kernels whose output is "
        "close to, not identical to, fp32",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument(
        "--compiled",
        choices=["auto", "on", "off"],
        default="auto",
        help="compile the target's forward: auto (CUDA at load; on a CPU, built in the background during a "
        "conversation and read back from the cache at later starts; the bench builds it first, once per "
        "machine; a one-shot --message stays uncompiled), "
        "on (at load everywhere), off",
    )


def add_context_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="TOKENS",
        help=f"tokens a conversation may hold, prompt and reply together; the KV cache is allocated at this "
        f"size (default {DEFAULT_CONTEXT_TOKENS:,}, or the model's own context where that is shorter)",
    )


def add_trees_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trees",
        choices=["on", "off"],
        default="on",
        help="verify a drafter's other candidates as a token tree where the measured cost allows (default on)",
    )


def add_chat_parser(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model in the terminal")
    add_model_options(parser)
    add_context_option(parser)
    parser.add_argument("--k", default="adaptive", help="'adaptive' or a fixed draft length 1-16")
    parser.add_argument("--max-k", type=int, default=8)
    add_trees_option(parser)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the reply before this text (repeat for several)",
    )
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument(
        "--message",
        default=None,
        help="answer this one message and exit (it may not be empty: that sends nothing)",
    )
    parser.add_argument(
        "--stats", action="store_true", help="print acceptance and speed-up after each answer"
    )
    parser.add_argument("--db", default=None, help="store the conversation in this SQLite file")
    parser.add_argument(
        "--server", default=None, help="answer through this OpenAI-compatible server (http://host:port)"
    )
    parser.add_argument(
        "--server-model", default=None, help="the server's model to use (default: the first it lists)"
    )
    parser.add_argument(
        "--api-key-env", default=None, help="read the server's API key from this environment variable"
    )
    parser.set_defaults(handler=run_chat)


def speculation_from_args(args) -> SpeculationSettings:
    draft = (args.draft or "").lower()
    drafter = draft if draft in ("ngram", "suffix", "auto", "none") else "model"
    if draft == "head" or draft.startswith("head:"):
        drafter = "head"
    if args.k == "adaptive":
        k = None
    else:
        try:
            k = int(args.k)
        except ValueError:
            raise SettingsError(
                f"--k must be 'adaptive' or an integer from 1 to 16, not '{args.k}'."
            ) from None
    settings = SpeculationSettings(drafter=drafter, k=k, max_k=args.max_k, trees=args.trees == "on")
    settings.validate()
    return settings


def sampling_from_args(args) -> SamplingSettings:
    settings = SamplingSettings(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        stop=tuple(getattr(args, "stop", None) or ()),
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


def draft_spec_for(args, speculation: SpeculationSettings) -> str | None:
    """What load_pair loads: the named draft, a quantized copy (None; auto drafts with it too) or none."""
    if not needs_draft_model(speculation.drafter):
        return NO_DRAFT
    return args.draft if speculation.drafter == "model" else None


def build_engine(args, speculation: SpeculationSettings, sampling: SamplingSettings):
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    check_context(args.context)
    progress = ProgressBar()
    try:
        target, draft = load_pair(
            args.target,
            draft_spec_for(args, speculation),
            quantization=args.quant,
            device=args.device,
            progress=progress,
            target_precision=args.precision,
        )
    finally:
        progress.close()
    print_kernel_notes(target, draft)
    # a one-shot reply would wait longer for the compiled path (seconds from the cache) than it saves
    compiled = (
        "off"
        if args.message is not None and args.compiled == "auto" and target.device.type == "cpu"
        else args.compiled
    )
    engine = ChatEngine(
        target,
        draft,
        speculation=speculation,
        sampling=sampling,
        compiled=compiled,
        remember_drafters=True,
        context=args.context,
    )
    if speculation.drafter == "head" and ":" in args.draft:
        engine.head_source = args.draft.split(":", 1)[1]
    progress = ProgressBar()
    try:
        engine.prepare(progress)
    finally:
        progress.close()
    return engine


def print_kernel_notes(target, draft) -> None:
    """Which quantized kernel each model uses here, and why (stderr, so answers stay clean)."""
    for role, loaded in (("Target", target), ("Draft", draft)):
        if loaded is not None and loaded.info.get("kernel"):
            print(f"{role} ({loaded.info['precision']}): {loaded.info['quantization_note']}", file=sys.stderr)


SAVE_RETRY_S = 5.0  # how often a reply that could not be saved (full disk) is saved again


def cut_notice(
    finished: Finished, sampling: SamplingSettings, context_length: int, interactive: bool = True
) -> str | None:
    """Why a reply stopped before the model ended it, or None when it ended by itself."""
    if finished.reason != "max_tokens":
        return None
    if len(finished.token_ids) >= sampling.max_new_tokens:
        return f"[reply cut at {sampling.max_new_tokens} tokens: raise --max-new-tokens for longer replies]"
    advice = "; /new starts a new conversation" if interactive else ""
    return f"[reply cut: the conversation filled the model's context of {context_length} tokens{advice}]"


def run_chat(args) -> int:
    speculation = speculation_from_args(args)
    sampling = sampling_from_args(args)
    one_shot = args.message is not None
    if one_shot:
        checked_text(args.message, "--message")
        if not args.message.strip():
            raise SettingsError("--message is empty: give the text to send, or leave --message out to chat.")
    if args.system:
        checked_text(args.system, "--system")
    # The terminal and the database first: a closed stdin or a wrong --db is reported in a second, not
    # after minutes of model loading; a --message is stored at once, so a kill during the load loses nothing.
    check_terminal(interactive=not one_shot)
    recorder = ConversationRecorder.open(args.db, args) if args.db else None
    try:
        if recorder is not None and one_shot:
            recorder.store_message(args.message)
        if args.server:
            from engine.cli.remote_chat import run_remote_chat

            return run_remote_chat(args, sampling, recorder)
        return _chat(args, build_engine(args, speculation, sampling), sampling, recorder)
    finally:
        if recorder is not None:
            recorder.close()


def _chat(args, engine, sampling: SamplingSettings, recorder: ConversationRecorder | None) -> int:
    def prepare_turn(messages):
        prompt_ids = engine.prompt_ids(messages)
        engine.check_fits(prompt_ids)  # before anything is stored: a refused message leaves no trace
        return functools.partial(engine.generate_ids, prompt_ids)

    def after_turn(finished):
        notice = cut_notice(finished, sampling, engine.context_length, interactive=args.message is None)
        if notice:
            print(notice, file=sys.stderr)

    # a conversation builds the compiled path beside it (a one-shot runs uncompiled: build_engine)
    engine.optimize_in_background(on_done=lambda message: print(f"[{message}]", file=sys.stderr))
    converse(args, engine.target.spec, recorder, prepare_turn, after_turn, on_new=engine.reset)
    return 0


class ConversationRecorder:
    """Stores a terminal conversation in the same SQLite store the app uses, the same way.

    The database is opened, claimed (the instance lock) and checked writable before the model loads. The
    conversation is created with the first message; a --message is stored then, before the model loads
    (store_message), so neither a failed load nor a kill during it loses it. An interactive run that
    fails before its first message leaves the database unchanged.
    Each reply is a 'streaming' row that a ThrottledUpdater keeps within half a second of the text
    printed, so kill -9 or Ctrl+C loses at most the last half second of a reply.
    """

    UPDATE_INTERVAL_S = 0.5

    def __init__(self, store, args) -> None:
        self.store = store
        self.args = args
        self.conversation_id: int | None = None
        self.last_id: int | None = None
        self.stored: str | None = None  # a message stored ahead of its reply (store_message)

    @classmethod
    def open(cls, db_path: str, args) -> ConversationRecorder:
        from engine.store.database import Store
        from engine.store.schema import check_writable

        store = Store(db_path)
        try:
            store.acquire_instance_lock()
            check_writable(store.db.conn, store.path)
        except BaseException:
            store.close()
            raise
        return cls(store, args)

    def close(self) -> None:
        self.store.close()

    def new_conversation(self) -> None:
        """The next message starts a new stored conversation (created with it, as the first was)."""
        self.conversation_id = None
        self.last_id = None

    def store_message(self, text: str) -> None:
        """Commit the user's message now, ahead of its reply; begin(text) then answers it."""
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(
                title=text[:60],
                target_model=self.args.target,
                draft_settings={"draft": self.args.draft, "quant": self.args.quant, "k": self.args.k},
                system_prompt=self.args.system or "",
            )
        self.last_id = self.store.add_message(self.conversation_id, "user", text, parent_id=self.last_id)
        self.stored = text

    def take_back(self) -> None:
        """Delete a message stored ahead of its reply that the model then refused (longer than its
        context), and its conversation: a refused message leaves no trace, as one never stored."""
        if self.stored is None:
            return
        with self.store.transaction() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (self.last_id,))
            if not db.execute(
                "SELECT 1 FROM messages WHERE conversation_id = ?", (self.conversation_id,)
            ).fetchone():
                db.execute("DELETE FROM conversations WHERE id = ?", (self.conversation_id,))
        self.new_conversation()
        self.stored = None

    def begin(self, text: str):
        """Commit the user's message (unless store_message did), then an empty streaming reply; the
        reply's updater."""
        from engine.store.streaming import ThrottledUpdater

        if self.stored == text:  # stored before the model loaded: name the model that answers it
            self.store.update_conversation(self.conversation_id, target_model=self.args.target)
        else:
            self.store_message(text)
        self.stored = None
        meta = {"target": self.args.target, "draft": self.args.draft, "k": self.args.k}
        self.last_id = self.store.begin_assistant(self.conversation_id, parent_id=self.last_id, meta=meta)
        return ThrottledUpdater(self.store, self.last_id, interval=self.UPDATE_INTERVAL_S)

    def finish(self, reply, finished: Finished) -> None:
        status = finished.reason if finished.reason in ("cancelled", "interrupted", "error") else "complete"
        self.save(reply, status, stats=finished.stats.to_dict(), token_count=len(finished.token_ids))

    def save(self, reply, status: str, **final) -> None:
        """End the reply; while the disk is full, keep it in memory and try again every few seconds."""
        from engine.errors import DiskFullError

        told = False
        while True:
            try:
                reply.finish(status, **final)
                if told:
                    print("tandem: saved.", file=sys.stderr)
                return
            except DiskFullError as exc:
                if not told:
                    print(
                        f"tandem: {exc} The reply is kept in memory and saved again every "
                        f"{SAVE_RETRY_S:.0f} s; Ctrl+C gives up.",
                        file=sys.stderr,
                    )
                    told = True
                time.sleep(SAVE_RETRY_S)
