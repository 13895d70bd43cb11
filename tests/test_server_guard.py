"""A local `tandem-cli serve` without an API key can be driven only by its user's programs: a web page in
the user's browser cannot make it generate (a CORS "simple request", a cross-origin fetch, a DNS-rebinding
page under a name of its own), while the openai client, curl and Tandem's remote backend still work.

Each request is sent by a real HTTP client to a real server process on the loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest
from test_server import ServerProcess, chat_body

from engine.models.builtin import DEFAULT_TARGET

PAGE = "http://localhost:3000"  # the one web page the server is told to let in
EVIL = "http://evil.example"
ALSO_SERVED = "tandem.lan"


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--cors-origin", PAGE, "--allow-host", ALSO_SERVED)
    yield process
    process.stop()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


def counters(client) -> dict:
    from engine.remote.metrics_page import parse_prometheus

    return {
        (name, labels.get("code") or labels.get("outcome")): value
        for name, labels, value in parse_prometheus(client.get("/metrics").text)
    }


def error_code(response) -> str:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    return error["code"]


def test_a_web_pages_simple_request_does_not_generate(client):
    """text/plain needs no preflight, so a page can send it to 127.0.0.1: it must be refused unread."""
    before = counters(client)
    text = json.dumps(chat_body(max_tokens=4))
    from_page = client.post(
        "/v1/chat/completions", content=text, headers={"Content-Type": "text/plain", "Origin": EVIL}
    )
    assert from_page.status_code == 403 and error_code(from_page) == "origin_not_allowed"
    assert "access-control-allow-origin" not in from_page.headers
    plain = client.post("/v1/chat/completions", content=text, headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415 and error_code(plain) == "unsupported_media_type"
    assert "Content-Type: application/json" in plain.json()["error"]["message"]
    after = counters(client)
    generated = ("tandem:generation_tokens_total", None)
    assert after.get(generated) == before.get(generated)  # nothing was generated
    for code in ("403", "415"):  # each refusal is counted under its status
        counted = ("tandem:request_errors_total", code)
        assert after[counted] == before.get(counted, 0) + 1


def test_cross_origin_requests_need_the_origin_named(client):
    foreign = client.post("/v1/chat/completions", json=chat_body(max_tokens=4), headers={"Origin": EVIL})
    assert foreign.status_code == 403 and error_code(foreign) == "origin_not_allowed"
    assert f"--cors-origin {EVIL}" in foreign.json()["error"]["message"]
    for method in ("GET", "POST"):
        asking = client.options(
            "/v1/chat/completions", headers={"Origin": EVIL, "Access-Control-Request-Method": method}
        )
        assert asking.status_code == 403 and "access-control-allow-origin" not in asking.headers
    assert client.get("/v1/models", headers={"Origin": "null"}).status_code == 403
    # the origin named with --cors-origin: its preflight is answered, its requests carry CORS headers
    preflight = client.options(
        "/v1/chat/completions",
        headers={
            "Origin": PAGE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == PAGE
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed_headers = preflight.headers["access-control-allow-headers"].lower()
    assert "content-type" in allowed_headers and "authorization" in allowed_headers
    assert preflight.headers["access-control-allow-private-network"] == "true"
    reply = client.post("/v1/chat/completions", json=chat_body(max_tokens=4), headers={"Origin": PAGE})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    assert reply.headers["access-control-allow-origin"] == PAGE


def test_requests_for_another_host_name_are_refused(server, client):
    """DNS rebinding: a page on evil.example, pointed at 127.0.0.1, sends Host: evil.example."""
    port = server.url.rsplit(":", 1)[1]
    rebound = client.post(
        "/v1/chat/completions", json=chat_body(max_tokens=4), headers={"Host": f"evil.example:{port}"}
    )
    assert rebound.status_code == 403 and error_code(rebound) == "host_not_allowed"
    assert "--allow-host evil.example" in rebound.json()["error"]["message"]
    assert client.get("/health", headers={"Host": "evil.example"}).status_code == 403
    for host in (
        f"localhost:{port}",
        f"127.0.0.1:{port}",
        f"[::1]:{port}",
        "127.0.0.2",
        f"{ALSO_SERVED}:{port}",
    ):
        assert client.get("/v1/models", headers={"Host": host}).status_code == 200, host


def test_the_openai_client_curl_and_the_remote_backend_still_work(server):
    import openai

    from engine.remote import RemoteEngine

    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none-needed", max_retries=0)
    reply = api.chat.completions.create(model=DEFAULT_TARGET, messages=chat_body()["messages"], max_tokens=4)
    assert reply.choices[0].message.content
    localhost = server.url.replace("127.0.0.1", "localhost")
    remote = RemoteEngine(localhost)
    remote.prepare()
    remote.sampling.max_new_tokens = 4
    assert remote.respond(chat_body()["messages"]).text == reply.choices[0].message.content
    remote.close()
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    url = f"{server.url}/v1/chat/completions"
    body = json.dumps(chat_body(max_tokens=4))
    done = subprocess.run(
        ["curl", "-sS", "-H", "Content-Type: application/json", "-d", body, url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["choices"][0]["message"]["content"], done.stderr
    forgot = subprocess.run(["curl", "-sS", "-d", body, url], capture_output=True, text=True, timeout=120)
    assert json.loads(forgot.stdout)["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("origin", ["localhost:3000", "http://localhost:3000/chat", "null", "*"])
def test_cors_origin_takes_an_origin(origin):
    from test_server import CLI

    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--cors-origin", origin], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--cors-origin takes" in done.stderr
