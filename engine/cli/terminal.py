"""The terminal side of a chat, local or remote: reading a line, printing a reply as it streams, its stats,
and the interactive chat's commands (/new, /help).

Text a model or a server wrote is shown through `visible()`: a terminal obeys the control characters in
what it prints (ESC starts a sequence that may set the title, write the clipboard with OSC 52, move the
cursor or erase the screen; a carriage return or backspace overwrites what was printed), so every
control character but newline and tab is shown as a visible symbol instead of reaching it.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable

from engine.errors import ContextOverflowError
from engine.events import Event, Failed, Finished, PrefillProgress, TextPiece

COMMANDS = {
    "/new": "start a new conversation (the model forgets this one)",
    "/help": "list these commands",
}
# a line that is one word after a slash is a command; "/etc/hosts is..." is a message
COMMAND_LINE = re.compile(r"/[A-Za-z?]+")
# C0 controls, DEL and C1 controls (Unicode category Cc), but for newline and tab
CONTROLS = re.compile(r"\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _symbol(match: re.Match) -> str:
    char = match.group()
    if char == "\r\n":  # a Windows line end is a line end
        return "\n"
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ESC is shown as "␛"
    return "\u2421" if code == 0x7F else f"<{code:02X}>"  # DEL as "␡"; C1 (CSI is 9B) as "<9B>"


def visible(text: str) -> str:
    """`text` with every control character but newline and tab shown as a symbol: safe to print to a
    terminal or to put in a rich-text view, and as long as the text or a little longer."""
    return CONTROLS.sub(_symbol, text)


class TerminalPrinter:
    def __init__(self, stream=sys.stdout) -> None:
        self.stream = stream
        self.reading_shown = 0  # characters of the prompt-reading line now on stderr

    def __call__(self, event: Event) -> None:
        if isinstance(event, TextPiece):
            self.stream.write(visible(event.text))
            self.stream.flush()
        elif isinstance(event, PrefillProgress):
            self.show_reading(event)
        elif isinstance(event, Failed):
            print(f"\n[error] {visible(event.message)}", file=sys.stderr)

    def show_reading(self, progress: PrefillProgress) -> None:
        """A long prompt's reading, on one line of stderr rewritten in place and blanked once the prompt
        is read, before the reply prints; only where stderr is a terminal, so logs stay clean."""
        err = sys.stderr
        if err is None or not getattr(err, "isatty", lambda: False)():
            return
        line = "" if progress.read >= progress.total else f"[reading the prompt: {progress.summary()}]"
        line = visible(line)
        err.write("\r" + line.ljust(self.reading_shown) + ("\r" if not line else ""))
        err.flush()
        self.reading_shown = len(line)


def format_stats(finished: Finished) -> str:
    stats = finished.stats
    parts = [f"{stats.generated_tokens} tokens", f"drafter {stats.drafter}"]
    if stats.tokens_per_s:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
    if stats.mean_accepted_length is not None:
        parts.append(f"mean accepted length {stats.mean_accepted_length:.2f}")
    if stats.tree_rounds:
        parts.append(
            f"token trees in {stats.tree_rounds} rounds ({stats.off_chain_rounds} won by a side branch)"
        )
    # the same rule as the app's panel: no speed-up claim for a reply that kept no draft token
    if stats.speedup is not None and stats.accepted > 0:
        parts.append(f"speed-up {stats.speedup_text()} vs target alone")
    if stats.note:
        parts.append(stats.note)
    return visible("[" + ", ".join(parts) + "]")  # the drafter's name and the note may be a server's


def checked_text(text: str, where: str) -> str:
    """The user's text, refused with one readable line when a model or the store could not take it."""
    from engine.errors import InvalidTextError
    from engine.store.records import check_text

    try:
        check_text(text, where)
    except InvalidTextError:
        raise InvalidTextError(f"{where} is not valid UTF-8 text; send it as UTF-8.") from None
    if "\x00" in text:
        raise InvalidTextError(
            f"{where} holds a NUL character (\\0 at position {text.index(chr(0))}); remove it."
        )
    return text


def check_terminal(interactive: bool) -> None:
    """Refuse, before a model loads, a chat with nowhere to print or, when it reads its messages,
    nothing to read them from (`<&-` closes standard input; Python then has no sys.stdin)."""
    from engine.errors import SettingsError

    if sys.stdout is None:
        raise SettingsError("Standard output is closed: there is nowhere to print the reply.")
    if interactive and sys.stdin is None:
        raise SettingsError(
            "Standard input is closed: give the message with --message, or start the chat with its input open."
        )


def read_line() -> str | None:
    """The next line the user types or pipes in; None at the end of input, or when the input is gone."""
    from engine.errors import InvalidTextError

    if sys.stdin is None or sys.stdin.closed:
        return None
    try:
        return input("\n> ")
    except (EOFError, OSError):  # OSError: a terminal that hung up
        return None
    except UnicodeDecodeError:
        raise InvalidTextError("Standard input is not valid UTF-8 text; send it as UTF-8.") from None


def answer_turn(printer, recorder, text: str, generate: Callable) -> Finished:
    """One reply of a terminal chat, local or remote: printed as it streams and, with a recorder,
    stored as it streams; Ctrl+C stores it as cancelled, a failure as error.

    `generate(on_event, cancel)` produces the reply."""
    reply = recorder.begin(text) if recorder else None

    def on_event(event: Event) -> None:
        printer(event)  # printed first: what the store holds is never ahead of the screen
        if reply is not None and isinstance(event, TextPiece):
            reply.append(event.text)

    cancel = threading.Event()
    try:
        finished = generate(on_event, cancel)
    except KeyboardInterrupt:
        cancel.set()
        if reply is not None:
            recorder.save(reply, "cancelled")
        raise
    except Exception:
        if reply is not None:
            recorder.save(reply, "error")
        raise
    print()
    if reply is not None:
        recorder.finish(reply, finished)
    return finished


def converse(
    args, title: str, recorder, prepare_turn: Callable, after_turn: Callable, on_new: Callable = lambda: None
) -> None:
    """A terminal conversation, local or remote: one turn for --message, else a turn per line read
    until an empty line or the end of input. prepare_turn(messages) -> the turn's generate callable
    (it may refuse the message before anything is stored); after_turn(finished) prints what the
    reply's end needs saying; on_new() runs when the user starts a new conversation (/new).

    In an interactive chat, a message past the model's context is refused with one line and the chat
    goes on: the user can send a shorter one, or /new."""
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict] = list(system)
    printer = TerminalPrinter()
    interactive = args.message is None
    if interactive:
        print(
            f"Tandem chat with {visible(title)}. /help lists the commands; an empty line or Ctrl+D quits.",
            file=sys.stderr,
        )
    while True:
        if interactive:
            line = read_line()
            text = checked_text(line.strip(), "The message") if line is not None else ""
            if not text:
                break
            if COMMAND_LINE.fullmatch(text):
                if text.lower() == "/new":
                    messages = list(system)
                    if recorder is not None:
                        recorder.new_conversation()
                    on_new()
                    print("[new conversation]", file=sys.stderr)
                else:
                    _help(text)
                continue
        else:
            text = args.message
        messages.append({"role": "user", "content": text})
        try:
            finished = answer_turn(printer, recorder, text, prepare_turn(messages))
        except ContextOverflowError as exc:
            messages.pop()
            if not interactive:
                if recorder is not None:
                    recorder.take_back()  # stored before the model loaded; refused, it leaves no trace
                raise ContextOverflowError(exc.facts, "Send a shorter message.") from None
            print(
                f"tandem: {visible(exc.facts)} Send a shorter message, or /new to start a new conversation.",
                file=sys.stderr,
            )
            continue
        messages.append({"role": "assistant", "content": finished.text})
        after_turn(finished)
        if args.stats:
            print(format_stats(finished), file=sys.stderr)
        if not interactive:
            break


def _help(command: str) -> None:
    lines = [f"  {name:<6} {what}" for name, what in COMMANDS.items()]
    lines.append("  An empty line or Ctrl+D quits; Ctrl+C stops a reply.")
    if command.lower() not in ("/help", "/?"):
        lines.insert(0, f"Unknown command {command}. The commands:")
    print("\n".join(lines), file=sys.stderr)
