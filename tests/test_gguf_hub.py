"""GGUF files from a hub repository, against a local server that answers as the hub does (tests/fake_hub.py):
listing with quantization, size and fit; a download checked against the hub's SHA-256; a damaged one
refused; a dropped connection resumed; cancel, and a cancelled or killed download continued from its
partial file; an unreachable hub in one line; the CLI's specs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.errors import ModelFormatError, ModelNotFoundError, OfflineError
from engine.models import gguf_hub
from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
from engine.models.hub import DownloadCancelled
from tests.fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
# SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions, K and V in fp32
SMOLLM2_KV_PER_TOKEN = 30 * 3 * (64 + 64) * 4


@pytest.fixture(scope="module")
def gguf_bytes() -> bytes:
    return builtin_gguf_path(builtin_entry(DEFAULT_TARGET)).read_bytes()


@pytest.fixture
def hub(gguf_bytes, tmp_path, monkeypatch):
    from huggingface_hub import constants

    server = FakeHub()
    server.add(
        REPO,
        {
            FILE: gguf_bytes,
            "SmolLM2-135M-Instruct-Q8_0.gguf": gguf_bytes[: 2 * 1024 * 1024],
            "big-Q2_K-00001-of-00002.gguf": b"a" * 300,
            "big-Q2_K-00002-of-00002.gguf": b"b" * 200,
            "mmproj-f16.gguf": b"vision",
            "README.md": b"# hi",
        },
    )
    server.start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "tandem"))
    yield server
    server.stop()


def snapshot_files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "hub").rglob("*.gguf"))


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
        ("model-f16.gguf", "F16"),
        ("Qwen2.5-0.5B-Instruct-Q8_0.gguf", "Q8_0"),
        ("notes.gguf", "?"),
    ],
)
def test_the_quantization_is_read_from_the_file_name(name, quant):
    assert gguf_hub.quant_of(name) == quant


def test_a_repository_lists_its_gguf_files_with_quant_size_and_fit(hub, gguf_bytes):
    files = {entry.quant: entry for entry in gguf_hub.list_gguf_files(REPO)}
    assert set(files) == {"Q4_1", "Q8_0", "Q2_K"}  # no projector, no README, the split file once
    assert files["Q4_1"].size_bytes == len(gguf_bytes)
    assert files["Q4_1"].sha256 == (hashlib.sha256(gguf_bytes).hexdigest(),)
    assert files["Q2_K"].split and files["Q2_K"].size_bytes == 500
    assert files["Q2_K"].files == ("big-Q2_K-00001-of-00002.gguf", "big-Q2_K-00002-of-00002.gguf")

    per_token = gguf_hub.remote_kv_bytes_per_token(files["Q4_1"])
    assert per_token == SMOLLM2_KV_PER_TOKEN
    assert any(
        method == "GET" and rng == f"bytes=0-{gguf_hub.HEADER_PROBE_BYTES - 1}"
        for method, _, rng in hub.requests
    )
    short, long = (
        gguf_hub.file_fit(len(gguf_bytes), per_token, n, available=2 * 1024**3) for n in (2048, 8192)
    )
    assert long.total_bytes - short.total_bytes == 6144 * SMOLLM2_KV_PER_TOKEN
    assert short.verdict == "fits"
    assert gguf_hub.file_fit(len(gguf_bytes), per_token, 8192, available=300 * 1024**2).verdict == "won't fit"


def test_a_download_is_checked_against_the_hubs_checksum(hub, gguf_bytes, tmp_path):
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    reports = []
    path = gguf_hub.download(entry, lambda stage, done, total: reports.append((stage, done, total)))
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()
    assert any(
        stage.startswith("Downloading") and done == total == len(gguf_bytes) for stage, done, total in reports
    )
    assert any(stage.startswith("Checking") for stage, _, _ in reports)
    # the spec finds the checked copy without asking the hub again
    asked = len(hub.requests)
    assert gguf_hub.resolve_spec(f"{REPO}:q4_1") == str(path)
    assert gguf_hub.resolve_spec(f"{REPO}/{FILE}") == str(path)
    assert len(hub.requests) == asked


def test_a_damaged_download_is_refused_and_deleted(hub, tmp_path):
    hub.corrupt.add((REPO, FILE))
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    with pytest.raises(ModelFormatError, match="damaged.*SHA-256.*download it again"):
        gguf_hub.download(entry)
    assert FILE not in snapshot_files(tmp_path) and partial_files(tmp_path) == []
    hub.corrupt.clear()
    assert gguf_hub.download(entry).name == FILE  # the next try starts clean


def test_a_dropped_connection_resumes_where_it_stopped(hub, gguf_bytes):
    hub.drop_after[(REPO, FILE)] = 25_000_000
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    path = gguf_hub.download(entry)
    ranges = [rng for method, p, rng in hub.requests if method == "GET" and p.endswith(FILE) and rng]
    resumed = [
        int(rng.removeprefix("bytes=").split("-")[0]) for rng in ranges if not rng.startswith("bytes=0-")
    ]
    assert resumed and 0 < resumed[0] <= 25_000_000
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()


def test_cancel_stops_a_download_midway(hub, tmp_path):
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    cancel, seen = threading.Event(), []

    def progress(stage, done, total):
        seen.append(done)
        if done > 0:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="cancelled"):
        gguf_hub.download(entry, progress, cancel)
    assert 0 < max(seen) < entry.size_bytes
    assert FILE not in snapshot_files(tmp_path)


def partial_files(tmp_path) -> list[Path]:
    return sorted((tmp_path / "tandem").rglob("*.part"))


def file_gets(hub) -> list[str | None]:
    """The Range header of every GET of FILE's bytes since the hub's record was last cleared."""
    return [rng for method, p, rng in hub.requests if method == "GET" and p.endswith(FILE)]


def cancel_midway(entry) -> None:
    cancel = threading.Event()

    def progress(stage, done, total):
        if done > 0:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="cancelled"):
        gguf_hub.download(entry, progress, cancel)


def test_a_cancelled_download_continues_where_it_stopped(hub, gguf_bytes, tmp_path):
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    cancel_midway(entry)
    [part] = partial_files(tmp_path)
    kept = part.stat().st_size
    assert 0 < kept < len(gguf_bytes)

    hub.requests.clear()
    reports = []
    path = gguf_hub.download(entry, lambda stage, done, total: reports.append((stage, done, total)))
    assert file_gets(hub) == [f"bytes={kept}-"]  # only the bytes that were missing
    downloading = [
        (done, total) for stage, done, total in reports if stage.startswith("Downloading") and total
    ]
    assert downloading[0] == (kept, len(gguf_bytes)) and downloading[-1] == (len(gguf_bytes),) * 2
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()
    assert partial_files(tmp_path) == []


def test_a_killed_download_continues_where_it_stopped(hub, gguf_bytes, tmp_path):
    script = (
        "import os, signal\n"
        "from engine.models import gguf_hub\n"
        f"entry = next(e for e in gguf_hub.list_gguf_files({REPO!r}) if e.quant == 'Q4_1')\n"
        "def progress(stage, done, total):\n"
        "    if done > 3 * 1024 * 1024:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "gguf_hub.download(entry, progress)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=os.environ, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    [part] = partial_files(tmp_path)
    kept = part.stat().st_size
    assert 0 < kept < len(gguf_bytes)

    hub.requests.clear()
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    path = gguf_hub.download(entry)
    assert file_gets(hub) == [f"bytes={kept}-"]
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()


def test_a_partial_file_of_a_changed_upstream_file_starts_over(hub, gguf_bytes, tmp_path):
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    cancel_midway(entry)
    assert len(partial_files(tmp_path)) == 1

    changed = gguf_bytes[:-1] + bytes([gguf_bytes[-1] ^ 0xFF])  # same size, another SHA-256
    hub.add(REPO, {FILE: changed})
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    hub.requests.clear()
    path = gguf_hub.download(entry)
    assert file_gets(hub) == [None]  # from the first byte, not spliced onto the old file's bytes
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(changed).digest()
    assert partial_files(tmp_path) == []


def test_a_damaged_partial_file_is_refused_and_deleted(hub, gguf_bytes, tmp_path):
    entry = next(e for e in gguf_hub.list_gguf_files(REPO) if e.quant == "Q4_1")
    cancel_midway(entry)
    [part] = partial_files(tmp_path)
    kept = part.stat().st_size
    damaged = bytearray(part.read_bytes())
    damaged[kept // 2] ^= 0xFF
    part.write_bytes(damaged)

    hub.requests.clear()
    with pytest.raises(ModelFormatError, match="damaged.*SHA-256.*partial file.*deleted.*download it again"):
        gguf_hub.download(entry)
    assert file_gets(hub) == [f"bytes={kept}-"]
    assert partial_files(tmp_path) == [] and FILE not in snapshot_files(tmp_path)
    path = gguf_hub.download(entry)  # the next try starts clean
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()


def test_an_unknown_quant_names_what_the_repository_offers(hub):
    with pytest.raises(ModelNotFoundError, match="no GGUF file Q5_K_M; it offers Q2_K, Q8_0, Q4_1"):
        gguf_hub.resolve_spec(f"{REPO}:Q5_K_M")
    with pytest.raises(ModelNotFoundError, match="has no 'acme/missing'"):
        gguf_hub.list_gguf_files("acme/missing")
    with pytest.raises(ModelFormatError, match="split into 2 files"):
        gguf_hub.resolve_spec(f"{REPO}:Q2_K")


def test_an_unreachable_hub_says_so_in_one_line(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(OfflineError) as raised:
        gguf_hub.list_gguf_files(REPO)
    message = str(raised.value)
    assert "cannot be reached" in message or "did not answer" in message
    assert f"127.0.0.1:{port}" in message and "\n" not in message


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("tandem-cli")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "engine.cli.main"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)


def test_the_cli_lists_a_repository_and_chats_with_a_hub_spec(hub, tmp_path, gguf_bytes):
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub")}
    env.pop("TANDEM_CACHE_DIR")  # the run's own cache: the kernels and the file's metadata are read once

    listed = cli("models", "--hub", REPO, "--context", "4096", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    files = {f["quant"]: f for f in json.loads(listed.stdout)["files"]}
    assert files["Q4_1"]["size_bytes"] == len(gguf_bytes) and files["Q4_1"]["kv_cache_known"]
    assert files["Q4_1"]["needs_bytes"] > len(gguf_bytes) + 4096 * SMOLLM2_KV_PER_TOKEN
    assert files["Q2_K"]["fit"] == "split: merge first" and files["Q4_1"]["fit"] in (
        "fits",
        "tight",
        "won't fit",
    )

    args = ["--draft", "none", "--max-new-tokens", "6", "--temperature", "0", "--message", "Say hello."]
    chat = cli("chat", "--target", f"{REPO}:Q4_1", *args, env=env)
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert "Downloading" in chat.stderr and FILE in chat.stderr  # progress on stderr
    assert FILE in snapshot_files(tmp_path)
    builtin = cli("chat", "--target", DEFAULT_TARGET, *args, env=env)
    assert builtin.returncode == 0 and chat.stdout.strip() and chat.stdout == builtin.stdout

    missing = cli("chat", "--target", f"{REPO}:Q6_K", *args, env=env)
    assert missing.returncode == 2 and "it offers" in missing.stderr and "Traceback" not in missing.stderr
    offline = cli("models", "--hub", REPO, env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 2 and "Traceback" not in offline.stderr
    assert len([line for line in offline.stderr.splitlines() if line.strip()]) == 1, offline.stderr
