"""RemoteEngine: a ChatBackend that answers through an OpenAI-compatible server, streaming.

The stats of a reply come from what the server reports, in this order:
  1. Tandem's own `tandem` object (tandem-cli serve): every GenerationStats field, as measured there;
  2. llama.cpp's `timings` (prompt/predicted counts and milliseconds, draft_n, draft_n_accepted);
  3. vLLM-style speculative counters on /metrics, read before and after the request (exact only
     while nobody else uses that server);
  4. `usage` only (any OpenAI-compatible server).
Whatever the server did not report is listed in `stats.unreported` and left at its default, which a
view shows as "not reported by this server". The times of a source other than Tandem are the
server's own, except `ttft_s` and, for a server with no timings, `total_time_s`: those are measured
here, around the request, and include the network.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from urllib.parse import urlsplit

import httpx

from engine.events import Event, Failed, Finished, RoundStats, TextPiece, TokenSpan
from engine.remote.errors import (
    RemoteContextOverflowError,
    RemoteError,
    RemoteProtocolError,
    RemoteRequestError,
    ServerAuthError,
    ServerBusyError,
    ServerUnreachableError,
)
from engine.remote.metrics_page import SpecCounters, spec_counters
from engine.remote.shapes import (
    MAX_BODY_BYTES,
    MAX_ERROR_BYTES,
    Chunk,
    Delta,
    bounded_lines,
    parse_chunk,
    parse_models,
    read_bounded,
)
from engine.settings import SamplingSettings, SpeculationSettings
from engine.stats import GenerationStats

# what a server may or may not report: GenerationStats fields and properties
REPORTABLE = (
    "drafter",
    "rounds",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "per_position_acceptance",
    "speedup",
    "target_step_time_s",
    "current_k",
    "k_history",
    "draft_time_s",
    "verify_time_s",
    "prefill_time_s",
    "prompt_tokens",
    "prefill_tokens",
    "generated_tokens",
    "decode_tokens_per_s",
    "tokens_per_s",
    "tree_rounds",
    "off_chain_rounds",
)
FINISH_REASONS = {"stop": "eos", "length": "max_tokens", "eos": "eos"}
STAT_FIELDS = {f.name for f in fields(GenerationStats)}


def normalize_base_url(base_url: str) -> str:
    """'host:8000', 'http://host:8000/', 'http://host:8000/v1' -> 'http://host:8000'."""
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteRequestError(f"'{base_url}' is not a server address: use http://host:port.")
    return url.removesuffix("/v1")


class RemoteEngine:
    """Answers through the server at `base_url`. `model=None` takes the first model it lists."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        *,
        timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        speculation: SpeculationSettings | None = None,
        sampling: SamplingSettings | None = None,
    ):
        self.base_url = normalize_base_url(base_url)
        self.model_name = model
        self.speculation = speculation or SpeculationSettings()
        self.sampling = sampling or SamplingSettings()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(read_timeout_s, connect=timeout_s)
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._timeout_s = timeout_s
        self._prepared = False
        self._metrics_deltas = False  # the server has vLLM-style counters (and is not Tandem)
        self.server_kind = "openai-compatible"

    # --- ChatBackend --------------------------------------------------------------------------

    def prepare(self, progress=None) -> None:
        """Checks that the server answers and accepts the key; picks the model when none was given."""
        models = parse_models(self._get_body("/v1/models"), f"{self.base_url}/v1/models")
        if not models:
            raise RemoteProtocolError(f"The server at {self.base_url} lists no models.")
        if self.model_name is None:
            self.model_name = models[0]
        elif self.model_name not in models:
            raise RemoteRequestError(
                f"The server at {self.base_url} has no model '{self.model_name}'; it has: {', '.join(models)}."
            )
        page = self._metrics_page()
        if page is not None and "tandem:" in page:
            self.server_kind = "tandem-server"
        elif page is not None and spec_counters(page) is not None:
            self._metrics_deltas = True
        self._prepared = True

    @property
    def notices(self) -> list[str]:
        notes = [f"Answers come from {self.model_name or 'the model'} on {self.base_url}."]
        notes.append("Speculative decoding settings are the server's own; changing them here has no effect.")
        if self._metrics_deltas:
            notes.append(
                "Speculative stats come from the server's /metrics counters and are exact only "
                "while no one else uses that server."
            )
        return notes

    def respond(
        self,
        messages: list[dict],
        on_event: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Finished:
        if not self._prepared:
            self.prepare()
        self.sampling.validate()
        emit = on_event or (lambda event: None)
        cancel = cancel or threading.Event()
        before = self._counters() if self._metrics_deltas else None
        reply = _Reply(time.monotonic())
        stop_watching = threading.Event()
        try:
            with self._client.stream(
                "POST", "/v1/chat/completions", json=self._request_body(messages)
            ) as response:
                if response.status_code != 200:
                    raise self._http_error(response)
                if _is_json(response):  # a server that ignored "stream": one whole reply
                    self._on_whole_reply(response, reply, emit)
                else:
                    self._read_stream(response, reply, emit, cancel, stop_watching)
        except (httpx.HTTPError, httpx.StreamError) as error:
            if cancel.is_set():
                pass  # the stream was closed to cancel
            elif not reply.started:
                raise self._transport_error(error) from None
            else:
                reply.broken = f"The connection to {self.base_url} broke off mid-reply ({_reason(error)})."
        finally:
            stop_watching.set()
        after = self._counters() if self._metrics_deltas and before is not None else None
        if reply.finish_reason is not None and not cancel.is_set():
            reply.done = True  # a final chunk arrived; a missing [DONE] after it loses nothing
        stats = self._stats(reply, before, after)
        if reply.error is not None:
            emit(Failed(f"The server stopped with an error: {reply.error}"))
            stats.note = f"The server stopped with an error: {reply.error}"
            finished = Finished("error", reply.text, (), stats)
        elif cancel.is_set() and not reply.done:
            finished = Finished("cancelled", reply.text, (), stats)
        elif not reply.done:
            stats.note = reply.broken or f"The reply from {self.base_url} ended before it was complete."
            finished = Finished("interrupted", reply.text, (), stats)
        else:
            finished = Finished(FINISH_REASONS.get(reply.finish_reason, "eos"), reply.text, (), stats)
        emit(finished)
        return finished

    def close(self) -> None:
        self._client.close()

    # --- request and reply --------------------------------------------------------------------

    def _request_body(self, messages: list[dict]) -> dict:
        sampling = self.sampling
        body = {
            "model": self.model_name,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _read_stream(self, response: httpx.Response, reply: _Reply, emit, cancel, stop_watching) -> None:
        watcher = threading.Thread(
            target=_close_on_cancel, args=(cancel, stop_watching, response), daemon=True
        )
        watcher.start()
        for line in bounded_lines(response.iter_bytes(), f"The server at {self.base_url}"):
            if cancel.is_set():
                break
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                reply.done = True
                break
            self._on_chunk(parse_chunk(payload, f"The server at {self.base_url}"), reply, emit)
            if reply.error is not None:
                break

    def _on_whole_reply(self, response: httpx.Response, reply: _Reply, emit) -> None:
        body, more = read_bounded(response.iter_bytes(), MAX_BODY_BYTES)
        if more:
            raise RemoteProtocolError(
                f"The server at {self.base_url} sent a reply longer than {MAX_BODY_BYTES >> 20} MiB."
            )
        self._on_chunk(parse_chunk(body, f"The server at {self.base_url}"), reply, emit)
        reply.done = reply.error is None

    def _on_chunk(self, chunk: Chunk, reply: _Reply, emit) -> None:
        if chunk.error is not None:
            error = chunk.error
            reply.error = str(error.get("message", error)) if isinstance(error, dict) else str(error)
            return
        for choice in chunk.choices or []:
            text = ((choice.delta or choice.message) or _NO_TEXT).content or ""
            if text:
                if reply.ttft_s is None:
                    reply.ttft_s = time.monotonic() - reply.start
                reply.text += text
                emit(TextPiece((TokenSpan(-1, text, "target"),)))
            if choice.finish_reason:
                reply.finish_reason = choice.finish_reason
        reply.started = True
        if chunk.timings is not None:
            reply.timings = chunk.timings.model_dump(exclude_none=True)
        if chunk.usage is not None:
            reply.usage = chunk.usage.model_dump(exclude_none=True)
        if chunk.tandem is not None:
            reply.tandem = chunk.tandem
        if chunk.tandem is not None or chunk.timings is not None:
            emit(RoundStats(self._stats(reply, None, None)))

    def _stats(
        self, reply: _Reply, before: SpecCounters | None, after: SpecCounters | None
    ) -> GenerationStats:
        reported: set[str] = set()
        tandem = reply.tandem
        if tandem and "generated_tokens" in tandem and "total_time_s" in tandem:
            data = {k: v for k, v in tandem.items() if k in STAT_FIELDS}
            data["verify_forward_s"] = {int(k): v for k, v in (data.get("verify_forward_s") or {}).items()}
            stats = GenerationStats(**data)
            stats.source, stats.unreported = "tandem-server", []
            return stats
        stats = GenerationStats(drafter="not reported", k_mode="server", source="openai-compatible")
        if tandem:  # progress fields of a Tandem stream still running
            for key in ("drafter", "rounds", "drafted", "accepted", "generated_tokens", "current_k"):
                if key in tandem:
                    setattr(stats, key, tandem[key])
                    reported.add(key)
            reported.add("acceptance_rate")
            stats.source = "tandem-server"
        usage = reply.usage or {}
        if "prompt_tokens" in usage:
            stats.prompt_tokens = int(usage["prompt_tokens"])
            reported.add("prompt_tokens")
        if "completion_tokens" in usage:
            stats.generated_tokens = int(usage["completion_tokens"])
            reported.add("generated_tokens")
        timings = reply.timings
        if timings:
            stats.source = "llama.cpp"
            prompt_ms, predicted_ms = (
                float(timings.get("prompt_ms", 0)),
                float(timings.get("predicted_ms", 0)),
            )
            stats.prefill_tokens = int(timings.get("prompt_n", 0))
            stats.prompt_tokens = stats.prefill_tokens + int(timings.get("cache_n", 0))
            stats.generated_tokens = int(timings.get("predicted_n", stats.generated_tokens))
            stats.prefill_time_s = prompt_ms / 1000
            stats.total_time_s = (prompt_ms + predicted_ms) / 1000
            reported |= {
                "prompt_tokens",
                "prefill_tokens",
                "generated_tokens",
                "prefill_time_s",
                "decode_tokens_per_s",
                "tokens_per_s",
            }
            if "draft_n" in timings:
                stats.drafter = "llama.cpp:speculative"
                stats.drafted = int(timings["draft_n"])
                stats.accepted = int(timings.get("draft_n_accepted", 0))
                reported |= {"drafter", "drafted", "accepted", "acceptance_rate"}
        elif after is not None and before is not None:
            delta = after.minus(before)
            stats.source = "vllm-metrics"
            stats.drafter = "server:speculative" if delta.num_draft_tokens else "not reported"
            stats.rounds = int(delta.num_drafts)
            stats.drafted = int(delta.num_draft_tokens)
            stats.accepted = int(delta.num_accepted_tokens)
            stats.per_position_accepted = [int(v) for v in delta.accepted_per_pos]
            stats.per_position_drafted = [int(delta.num_drafts)] * len(delta.accepted_per_pos)
            reported |= {"rounds", "drafted", "accepted", "acceptance_rate", "per_position_acceptance"}
            if delta.num_draft_tokens:
                reported.add("drafter")
        if not timings:  # no server times: the request's wall time as measured here
            stats.total_time_s = time.monotonic() - reply.start
            if "generated_tokens" in reported:
                reported.add("tokens_per_s")
        stats.ttft_s = reply.ttft_s
        stats.unreported = [name for name in REPORTABLE if name not in reported]
        return stats

    # --- HTTP helpers -------------------------------------------------------------------------

    def _get_body(self, path: str) -> bytes:
        """The body of a GET that must answer 200, read up to MAX_BODY_BYTES."""
        try:
            with self._client.stream("GET", path, timeout=self._timeout_s) as response:
                if response.status_code != 200:
                    raise self._http_error(response)
                body, more = read_bounded(response.iter_bytes(), MAX_BODY_BYTES)
        except httpx.HTTPError as error:
            raise self._transport_error(error) from None
        if more:
            raise RemoteProtocolError(
                f"{self.base_url}{path} answered with more than {MAX_BODY_BYTES >> 20} MiB."
            )
        return body

    def _metrics_page(self) -> str | None:
        try:
            with self._client.stream("GET", "/metrics", timeout=self._timeout_s) as response:
                if response.status_code != 200:
                    return None
                body, _ = read_bounded(response.iter_bytes(), MAX_BODY_BYTES)
        except httpx.HTTPError:
            return None
        return body.decode("utf-8", errors="replace")

    def _counters(self) -> SpecCounters | None:
        page = self._metrics_page()
        return spec_counters(page) if page is not None else None

    def _transport_error(self, error: httpx.HTTPError) -> RemoteError:
        if isinstance(error, httpx.TimeoutException):
            return ServerUnreachableError(
                f"The server at {self.base_url} did not answer in time ({_reason(error)})."
            )
        return ServerUnreachableError(
            f"Cannot reach the server at {self.base_url} ({_reason(error)}). Check the address and that it is running."
        )

    def _http_error(self, response: httpx.Response) -> RemoteError:
        message, code = _error_message(response)
        status = response.status_code
        if code in (
            "host_not_allowed",
            "origin_not_allowed",
        ):  # a Tandem server's guard: the message says what to do
            return RemoteRequestError(f"The server at {self.base_url} refused the request: {message}")
        if status in (401, 403):
            return ServerAuthError(
                f"The server at {self.base_url} refused the request: {message} Check the API key."
            )
        if status == 503 or status == 429:
            return ServerBusyError(f"The server at {self.base_url} is busy: {message}")
        if code == "context_length_exceeded" or "context" in message.lower() and status == 400:
            return RemoteContextOverflowError(message)
        if 400 <= status < 500:
            return RemoteRequestError(f"The server refused the request: {message}")
        return RemoteError(f"The server at {self.base_url} failed (HTTP {status}): {message}")


class _Reply:
    """What has arrived of one streamed reply."""

    def __init__(self, start: float):
        self.start = start
        self.text = ""
        self.started = False
        self.done = False
        self.finish_reason: str | None = None
        self.ttft_s: float | None = None
        self.timings: dict | None = None
        self.usage: dict | None = None
        self.tandem: dict | None = None
        self.error: str | None = None
        self.broken: str | None = None


def _close_on_cancel(cancel: threading.Event, stop: threading.Event, response: httpx.Response) -> None:
    """Closes the stream when `cancel` is set, so a server between chunks learns at once."""
    while not stop.is_set():
        if cancel.wait(0.05):
            response.close()
            return


_NO_TEXT = Delta()


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"


def _error_message(response: httpx.Response) -> tuple[str, str | None]:
    """The message and code of an error answer, from at most MAX_ERROR_BYTES of its body."""
    body, _ = read_bounded(response.iter_bytes(), MAX_ERROR_BYTES)
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return (text.strip()[:200] or f"HTTP {response.status_code}"), None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        code = error.get("code")
        return str(error.get("message") or error)[:2000], code if isinstance(code, str) else None
    return str(error)[:2000], None


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__
