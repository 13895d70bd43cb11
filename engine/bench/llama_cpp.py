"""llama.cpp's `llama-server` as a benchmark method, on the same GGUF and the same prompt tokens.

`llama-cpp` is plain decoding; `llama-cpp-spec` is llama.cpp's own speculative decoding with the same
GGUF as draft (`-md`), the usual way to try it without a second model; `llama-cpp-f32` is plain
decoding on an F32 copy of the GGUF (engine/bench/f32_gguf.py), the weights Tandem's fp32 target holds. Each turn sends Tandem's
prompt token ids to `/completion` (so both engines read identical tokens) and times the call here,
as the Tandem methods are timed around `generate_ids`. Draft counts are llama.cpp's `timings`
(draft_n, draft_n_accepted); llama.cpp does not report rounds, so no mean accepted length is shown.
Its time to first token is the call's time less the decoding time llama.cpp reports (predicted_ms).

llama-server runs as a user runs it: its own defaults, with the thread count Tandem uses and one
slot. Its decode speed is its own `timings` (the tokens after the first over `predicted_ms`), as
Tandem's is the tokens after its first over the time after it. Both run the GGUF's own blocks on
their own kernels (`llama-cpp-f32` compares with Tandem's `--precision fp32` target instead). The
binaries come from packaging/build_llama_cpp.sh.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path

from engine.bench.records import Tally, TurnResult
from engine.errors import TandemError

LLAMA_CPP_KINDS = ("llama-cpp", "llama-cpp-spec", "llama-cpp-f32")
DEFAULT_BIN = Path(__file__).resolve().parents[2] / ".venv" / "llama.cpp" / "bin"
START_TIMEOUT_S = 180


class LlamaCppNotBuiltError(TandemError):
    pass


def llama_server_path() -> Path:
    path = Path(os.environ.get("TANDEM_LLAMA_CPP_BIN", DEFAULT_BIN)) / "llama-server"
    if not path.is_file():
        raise LlamaCppNotBuiltError(
            f"The llama-cpp methods need llama-server, which is not built ({path}). "
            "Build it once with packaging/build_llama_cpp.sh (about 10-15 minutes)."
        )
    return path


def gguf_for(target_spec: str) -> Path:
    """The GGUF file behind a target: a .gguf path, or the built-in model's packaged file."""
    from engine.models.builtin import builtin_entry, builtin_gguf_path, is_builtin

    if is_builtin(target_spec):
        return builtin_gguf_path(builtin_entry(target_spec))
    if target_spec.endswith(".gguf") and Path(target_spec).is_file():
        return Path(target_spec)
    raise TandemError(f"The llama-cpp methods need a .gguf target or a built-in model, not '{target_spec}'.")


class LlamaServerProcess:
    """One llama-server on a free loopback port, stopped when the runner is collected or at exit."""

    def __init__(self, gguf: Path, threads: int, context: int, extra: list[str]):
        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = [
            str(llama_server_path()),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            str(threads),
            "-c",
            str(context),
            "-np",
            "1",
            "--no-webui",
            *extra,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent
        )
        self._finalizer = weakref.finalize(self, _stop, self.process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise TandemError("llama-server stopped at start-up: " + self.process.stderr.read()[-500:])
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TandemError(f"llama-server did not start within {START_TIMEOUT_S} s.")
            time.sleep(0.2)

    def stop(self) -> None:
        self._finalizer()


def _die_with_parent() -> None:
    """In the child: on Linux, ask for SIGTERM when the benchmark process dies, however it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class LlamaCppRunner:
    """A benchmark method served by llama-server; same interface as the Tandem and HF runners."""

    def __init__(self, method, target_spec: str, sampling, threads: int | None = None, context: int = 4096):
        import httpx
        import torch

        self.method = method
        self.sampling = sampling
        gguf = gguf_for(target_spec)
        if method.kind == "llama-cpp-f32":
            from engine.bench.f32_gguf import f32_gguf

            gguf = f32_gguf(gguf)
        extra = ["-md", str(gguf), "--spec-type", "draft-simple"] if method.kind == "llama-cpp-spec" else []
        threads = threads or torch.get_num_threads()
        if extra:
            extra += ["-td", str(threads)]
        self.server = LlamaServerProcess(gguf, threads, context, extra)
        self._client = httpx.Client(base_url=self.server.url, timeout=600)
        self._first_turn = True
        self.prefilled_tokens = 0  # prompt tokens llama-server processed in the last turn (timings' prompt_n)

    def start_prompt(self) -> None:
        """A new question is prefilled whole, as the Tandem methods prefill it from empty caches.
        llama-server would otherwise reuse what its slot or its RAM prompt cache holds: all of a prompt
        that the warm-up or a repeat pass sent before, or the chat template's opening."""
        self._first_turn = True

    def run_turn(self, prompt_ids: list[int], tokenizer) -> TurnResult:
        sampling = self.sampling
        body = {
            "prompt": list(prompt_ids),
            "n_predict": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "return_tokens": True,
            # later turns reuse the question's earlier turns, as Tandem's cache does
            "cache_prompt": not self._first_turn,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        start = time.perf_counter()
        response = self._client.post("/completion", json=body)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise TandemError(f"llama-server refused a benchmark prompt: {response.text[:300]}")
        self._first_turn = False
        data = response.json()
        token_ids = [int(t) for t in data.get("tokens", [])]
        timings = data.get("timings", {})
        self.prefilled_tokens = int(timings.get("prompt_n", 0))
        tally = Tally(calls=1, generated_tokens=len(token_ids), time_s=elapsed)
        tally.drafted = int(timings.get("draft_n", 0))
        tally.accepted = int(timings.get("draft_n_accepted", 0))
        if "predicted_ms" in timings and token_ids:
            # the first token comes out of the prompt's forward; what follows is llama.cpp's decoding time,
            # over the tokens after the first (as Tandem's decode speed is counted)
            decoding_s = float(timings["predicted_ms"]) / 1e3
            tally.ttft_sum_s, tally.ttft_count = max(0.0, elapsed - decoding_s), 1
            if len(token_ids) > 1 and decoding_s > 0:
                tally.decode_tokens, tally.decode_time_s = len(token_ids) - 1, decoding_s
        return TurnResult(token_ids, tokenizer.decode(token_ids, skip_special_tokens=True), tally)

    def close(self) -> None:
        self._client.close()
        self.server.stop()
