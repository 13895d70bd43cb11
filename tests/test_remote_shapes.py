"""A server that answers valid JSON of the wrong shape, or a stream line that never ends, gets one clear
line from the real `tandem-cli chat --server` and a RemoteProtocolError from the remote backend (what
the app answers through), never a traceback; the endless line is refused after 1 MiB, not buffered."""

from __future__ import annotations

import threading

import pytest
from fake_openai_server import ENDLESS_BYTES, WRONG_SHAPES, FakeServer
from test_terminal_safety import run_cli

from engine.errors import TandemError
from engine.remote.client import RemoteEngine
from engine.remote.errors import RemoteProtocolError
from engine.remote.shapes import MAX_LINE_BYTES, bounded_lines

CASES = {
    "models-null": "data: input should be a valid list",
    "choices-int": "choices.0: input should be a valid dictionary",
    "delta-str": "choices.0.delta: input should be a valid dictionary",
    "choices-dict": "choices: input should be a valid list",
    "content-int": "choices.0.delta.content: input should be a valid string",
    "usage-str": "usage: input should be a valid dictionary",
    "tandem-str": "generated_tokens: input should be a valid integer",
    "endless": "sent a stream line longer than 1 mib",
}
assert set(WRONG_SHAPES) <= set(CASES)


@pytest.fixture(scope="module")
def server():
    with FakeServer() as fake:
        yield fake


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_shape_is_one_line_from_the_cli(server, case):
    result = run_cli("chat", "--server", f"{server.url}/{case}", "--message", "hi")
    lines = [line for line in result.stderr.decode().splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr.decode()
    assert len(lines) == 1 and lines[0].startswith("tandem: "), lines
    assert CASES[case] in lines[0].lower() and server.url in lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_shape_is_a_protocol_error_from_the_remote_backend(server, case):
    engine = RemoteEngine(f"{server.url}/{case}")
    try:
        with pytest.raises(RemoteProtocolError) as raised:
            engine.respond([{"role": "user", "content": "hi"}], cancel=threading.Event())
    finally:
        engine.close()
    assert isinstance(raised.value, TandemError) and CASES[case] in str(raised.value).lower()
    assert "\n" not in str(raised.value)


def test_the_endless_line_is_not_read_to_its_end(server):
    server.sent_endless = 0
    engine = RemoteEngine(f"{server.url}/endless")
    try:
        with pytest.raises(RemoteProtocolError):
            engine.respond([{"role": "user", "content": "hi"}])
    finally:
        engine.close()
    # what the client read, plus what the sockets' buffers held when it hung up: far from all of it
    assert MAX_LINE_BYTES <= server.sent_endless < ENDLESS_BYTES // 8


def test_lines_split_at_every_line_end_and_over_chunk_edges():
    chunks = [b"data: a\r", b"\ndata: b\n\nda", b"ta: c\rdata: \xc3", b"\xa9"]
    assert [line for line in bounded_lines(chunks, "x") if line] == [
        "data: a",
        "data: b",
        "data: c",
        "data: é",
    ]
    with pytest.raises(RemoteProtocolError, match="longer than 1 MiB"):
        list(bounded_lines(iter([b"x" * 1000] * 2000), "x", limit=1 << 20))
