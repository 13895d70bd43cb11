"""No request can stall the server or be mistaken for a server error: a hostile body is refused before it
is parsed while other clients are served, a client that hangs up during its upload is counted as gone,
silent and trickling connections are timed out, and the Host, `max_tokens` and roles are read strictly.

Requests go through real HTTP on the loopback: to a `tandem-cli serve` process on the built-in model,
and, where a timeout must be short to be tested, to uvicorn started in this process with Tandem's own
connection set-up (engine.server.connections) and short limits.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from test_server import LONG_PROMPT, ServerProcess, chat_body, metrics, raw, raw_http, wait_until

from engine.models.builtin import DEFAULT_TARGET


@pytest.fixture(scope="module")
def server():
    process = ServerProcess()  # no API key: the Host rules apply
    yield process
    process.stop()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def tiny_arrays_body(count: int) -> bytes:
    """A valid chat request with `count` empty arrays in the ignored `user` field (3 bytes each)."""
    return raw(chat_body(user=[])).replace(b"[]", b"[" + b"[]," * (count - 1) + b"[]]")


# --- a hostile body while another client streams --------------------------------------------------


def test_a_body_of_tiny_arrays_is_refused_unparsed_while_a_stream_and_health_go_on(server, client):
    hostile = tiny_arrays_body(2_600_000)  # 7.8 MB, under the size limit: json.loads alone takes ~1 s
    order: list[str] = []
    answers: dict[str, httpx.Response] = {}

    def send_hostile() -> None:
        answers["hostile"] = httpx.post(
            f"{server.url}/v1/chat/completions",
            content=hostile,
            headers={"Content-Type": "application/json"},
            timeout=120,
        )
        order.append("hostile answered")

    body = chat_body(LONG_PROMPT, stream=True, max_tokens=200)
    with client.stream("POST", "/v1/chat/completions", json=body) as running:
        lines = running.iter_lines()
        while '"content": "' not in next(lines).replace('"content": ""', ""):
            pass  # the engine is writing the reply
        sender = threading.Thread(target=send_hostile)
        sender.start()
        while sender.is_alive():
            assert client.get("/health").json()["status"] == "ok"
            order.append("health")
        sender.join()
        after = [line for line in lines if line.startswith("data: ")]
    assert "health" in order
    assert after[-1] == "data: [DONE]"
    assert any('"content": "' in line.replace('"content": ""', "") for line in after)  # text went on coming
    refused = answers["hostile"]
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_json" and "too many JSON values" in error["message"]


def test_a_20_mb_body_is_refused_by_its_declared_size_before_it_is_sent(server):
    headers = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 20000000\r\nConnection: close\r\n\r\n"
    )
    status, body = raw_http(server.url, headers.encode())  # the body itself is never sent
    assert status == 413 and body["error"]["code"] == "request_too_large"


# --- a client that hangs up during its upload -----------------------------------------------------


def test_a_client_that_hangs_up_during_its_upload_is_counted_as_gone_not_as_a_server_error(server, client):
    gone = ("tandem:request_total", (("outcome", "disconnected"),))
    failed = ("tandem:request_errors_total", (("code", "500"),))
    before = metrics(client)
    with socket.create_connection(address(server.url), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": "'
        )
        time.sleep(0.2)  # the request reaches the app, which waits for the rest of the body
    wait_until(lambda: metrics(client).get(gone, 0) == before.get(gone, 0) + 1, what="the disconnect")
    after = metrics(client)
    assert after.get(failed, 0) == before.get(failed, 0)
    assert not any(
        key[0] == "tandem:request_errors_total" and after[key] != before.get(key, 0) for key in after
    )
    assert "Traceback" not in "".join(server.stderr) and "ClientDisconnect" not in "".join(server.stderr)


# --- the Host header ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:evil.com",
        "[::1]evil.com",
        "",
        "   ",
        "local host",
        "[::1",
        "evil.com:99999",
        "a:b:c",
        "x@y",
    ],
)
def test_a_malformed_host_is_refused(server, host):
    status, body = raw_http(
        server.url, f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    )
    assert status == 400 and body["error"]["code"] == "invalid_host", body


def test_without_a_key_a_request_that_names_no_host_is_refused(server):
    status, body = raw_http(server.url, b"POST /v1/chat/completions HTTP/1.0\r\n\r\n")
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    assert "Host header" in body["error"]["message"]
    host = f"Host: 127.0.0.1:{address(server.url)[1]}\r\n".encode()
    status, body = raw_http(server.url, b"GET /health HTTP/1.0\r\n" + host + b"\r\n")
    assert status == 200 and body["status"] == "ok"


# --- max_tokens and the developer role ------------------------------------------------------------


def test_max_tokens_up_to_the_context_is_taken_and_beyond_it_refused():
    from engine.server.schemas import ApiError, parse_chat_request
    from engine.settings import SamplingSettings

    for name in ("max_tokens", "max_completion_tokens"):
        taken = parse_chat_request(chat_body(**{name: 2048}), DEFAULT_TARGET, SamplingSettings(), 2048)
        assert taken.sampling.max_new_tokens == 2048
        with pytest.raises(ApiError, match="at most 2048, the model's context length") as refused:
            parse_chat_request(chat_body(**{name: 2049}), DEFAULT_TARGET, SamplingSettings(), 2048)
        assert refused.value.status == 400 and refused.value.param == name


def test_the_developer_role_is_a_system_message(client):
    replies = {}
    for role in ("system", "developer"):
        messages = [{"role": role, "content": "Answer in French."}, *LONG_PROMPT]
        response = client.post("/v1/chat/completions", json=chat_body(messages, max_tokens=6))
        assert response.status_code == 200, response.text
        reply = response.json()
        replies[role] = (reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens"])
    assert replies["developer"] == replies["system"]
    alone = client.post("/v1/chat/completions", json=chat_body(LONG_PROMPT, max_tokens=6)).json()
    # the instruction was in the prompt, in the place of the template's default system message
    assert alone["usage"]["prompt_tokens"] != replies["system"][1]


# --- connections that keep the server waiting -----------------------------------------------------


HEADER_LIMIT_S, BODY_LIMIT_S = 0.5, 3.0


@pytest.fixture(scope="module")
def quick_server(make_tiny):
    """uvicorn in this process as `tandem-cli serve` sets it up, with limits of a few seconds at most."""
    import uvicorn

    from engine.server.app import create_app
    from engine.server.connections import server_config
    from engine.server.listen import bind_socket
    from engine.session import ChatEngine

    app = create_app(ChatEngine(make_tiny(seed=3)), "tiny", body_timeout_s=BODY_LIMIT_S)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(server_config(app, header_timeout_s=HEADER_LIMIT_S, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the server to start")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(30)


def trickled(
    url: str, data: bytes, at_once: bytes = b"", pause_s: float = 0.1, give_up_s: float = 60
) -> tuple[bool, bytes]:
    """Sends `at_once`, then `data` a byte at a time, `pause_s` apart, reading what comes back meanwhile,
    then waits: (whether the server closed the connection within `give_up_s`, what it sent)."""
    deadline = time.monotonic() + give_up_s
    received, sent = b"", 0
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(at_once)
        sock.settimeout(pause_s)
        while time.monotonic() < deadline:
            if sent < len(data):
                try:
                    sock.sendall(data[sent : sent + 1])
                except OSError:
                    return True, received
                sent += 1
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return True, received
            if not chunk:
                return True, received
            received += chunk
    return False, received


POST_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n"
)


def test_a_silent_connection_is_closed(quick_server):
    closed, sent = trickled(quick_server, b"")
    assert closed and sent == b""


def test_headers_sent_a_byte_at_a_time_are_cut_off(quick_server):
    """Header lines that never end: a byte that arrives restarts no clock, so the connection is closed."""
    closed, sent = trickled(
        quick_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: 1\r\n" * 30
    )
    assert closed and sent == b""


def test_a_body_sent_a_byte_at_a_time_gets_408(quick_server):
    closed, sent = trickled(quick_server, b" " * 400, at_once=POST_HEAD % 400)
    assert closed and sent.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in sent, sent


def test_a_body_that_takes_longer_than_the_header_limit_is_still_read(quick_server):
    """The header clock stops once the headers are in: a body within its own limit is read and answered."""
    body = b'{"model": "nope", "messages": []}'
    head = POST_HEAD % len(body)
    with socket.create_connection(address(quick_server), timeout=60) as sock:
        sock.sendall(head)
        for byte in body:  # about a second: past the header limit, within the body's
            sock.sendall(bytes([byte]))
            time.sleep(HEADER_LIMIT_S * 2 / len(body))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 404 ") and b'"code":"model_not_found"' in answer, answer
