"""A hostile OpenAI-compatible server on 127.0.0.1, for the terminal client's and the remote backend's
tests: the first part of the path names what it does wrong, so one server serves every case
(`http://127.0.0.1:PORT/<case>` is the address a client is given).

Cases: terminal escape sequences in the model's name, in stream chunks, in a reply that is not streamed
and in error bodies; JSON of the wrong shape; a stream line that never ends.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# every way text can drive a terminal: erase and cursor home, a title (OSC 0), the clipboard (OSC 52),
# cursor movement split over two chunks, a C1 CSI, DCS, BEL, backspaces and a carriage-return overwrite
HOSTILE = [
    "\x1b[2J\x1b[H",
    "plain\ttext\n",
    "\x1b]0;owned title\x07",
    "\x1b]52;c;ZWNobyBvd25lZA==\x07",
    "\x1b]52;c;ZWNobyBvd25lZA==\x1b\\",
    "moved\x1b",
    "[3A up",
    "\x9b31m red \x9d0;c1 title\x9c",
    "\x1bP1$r\x1b\\",
    "ring\x07\x07",
    "abc\x08\x08\x08XYZ",
    "safe\rEVIL\n",
    "\x1bc\x7f\x00\x05\x0e\x0f\x1b",
]
HOSTILE_ERROR = "bad request \x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b]0;owned\x07\x9b2J\rend"
ENDLESS_BYTES = 200 << 20

WRONG_SHAPES = {  # case: what the stream sends instead of a chunk
    "choices-int": {"choices": [1]},
    "delta-str": {"choices": [{"delta": "x"}]},
    "choices-dict": {"choices": {"a": 1}},
    "content-int": {"choices": [{"delta": {"content": 123}}]},
    "usage-str": {"choices": [], "usage": "lots"},
    "tandem-str": {"choices": [], "tandem": {"generated_tokens": "many", "total_time_s": 1}},
}


class FakeServer:
    def __init__(self) -> None:
        self.sent_endless = 0  # bytes of the endless line sent before the client hung up
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        case, _, path = self.path.strip("/").partition("/")
        if path == "v1/models":
            if case == "models-null":
                return self._json(200, {"data": None})
            if case == "models-error":
                return self._send(500, "text/plain", HOSTILE_ERROR.encode())
            name = "m\x1b]0;owned\x07" if case.startswith("escapes") else "fake-model"
            return self._json(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
        self._send(404, "text/plain", b"not found")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        case = self.path.strip("/").partition("/")[0]
        if case == "escapes-error":
            return self._json(400, {"error": {"message": HOSTILE_ERROR, "code": "bad\x1b[2J"}})
        if case == "escapes-whole":
            text = "".join(HOSTILE)
            reply = {
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]
            }
            return self._json(200, reply)
        if case == "endless":
            return self._endless()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        if case in WRONG_SHAPES:
            self._event({"choices": [{"delta": {"content": "fine so far "}}]})
            self._event(WRONG_SHAPES[case])
        elif case == "escapes-stream-error":
            self._event({"choices": [{"delta": {"content": "partly "}}]})
            self._event({"error": {"message": HOSTILE_ERROR}})
        else:
            for piece in HOSTILE:
                self._event({"choices": [{"delta": {"content": piece}}]})
            tandem = {
                "drafter": "x\x1b]0;owned\x07",
                "generated_tokens": 5,
                "total_time_s": 0.5,
                "note": "noted \x1b[2J\x9b1A",
            }
            self._event({"choices": [{"delta": {}, "finish_reason": "stop"}], "tandem": tandem})
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _endless(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        block = b"data: " + b"x" * (1 << 16)
        try:
            while self.server_state.sent_endless < ENDLESS_BYTES:
                self.wfile.write(block)
                self.server_state.sent_endless += len(block)
        except OSError:
            pass  # the client hung up

    def _event(self, data) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _json(self, status: int, data) -> None:
        self._send(status, "application/json", json.dumps(data).encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
