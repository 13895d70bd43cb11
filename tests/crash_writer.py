"""Writes one conversation the way the app does, streaming a fake reply until it is killed.

    python tests/crash_writer.py DB LOG SEED [PIECE_DELAY_S] [INTERVAL_S]

The log (one line per event, written straight to the file so a SIGKILL cannot lose it):
    U <conversation_id> <user_message_id>   user message committed (fsync)
    A <message_id>                          streaming reply created (fsync)
    P <monotonic_time> <chars_produced>     a piece produced, just before it is handed to the updater
    C <chars_committed>                     the updater committed this much (fsync)
    F                                       reply finished
test_store_crash.py reads it after the kill to know what must be in the database.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.store.database import Store  # noqa: E402
from engine.store.streaming import ThrottledUpdater  # noqa: E402

ALPHABET = "abcdefghij klmnopqrstuvwxyz \n.,;é漢字🙂 ÄÖÜß→∑"
MAX_PIECE = 12
STREAM_SECONDS = 30.0


def user_text(seed: int) -> str:
    return f"Question {seed}: tell me a long story about crash safety."


def pieces(seed: int) -> Iterator[str]:
    """The fake generation for a seed: the same pieces every time, so the test can rebuild them."""
    rng = random.Random(seed)
    while True:
        yield "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, MAX_PIECE)))


def main() -> None:
    db, log_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    piece_delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.002
    interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.5
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(line: str, sync: bool = False) -> None:
        os.write(log, (line + "\n").encode())
        if sync:
            os.fsync(log)

    store = Store(db)
    conversation_id = store.create_conversation(f"crash run {seed}", "fake/target", {"k": 4}, "")
    user_id = store.add_message(conversation_id, "user", user_text(seed))
    record(f"U {conversation_id} {user_id}", sync=True)
    message_id = store.begin_assistant(conversation_id, parent_id=user_id, meta={"drafter": "fake"})
    record(f"A {message_id}", sync=True)

    updater = ThrottledUpdater(
        store, message_id, interval=interval, on_commit=lambda n: record(f"C {n}", sync=True)
    )
    produced = 0
    deadline = time.monotonic() + STREAM_SECONDS
    for piece in pieces(seed):
        if time.monotonic() > deadline:
            break
        produced += len(piece)
        record(f"P {time.monotonic():.6f} {produced}")
        updater.append(piece)
        time.sleep(piece_delay)
    updater.finish("complete", stats={"tokens_per_s": 0.0}, token_count=produced)
    record("F", sync=True)
    store.close()


if __name__ == "__main__":
    main()
