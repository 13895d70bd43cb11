"""The OpenAI chat-completions wire format: request checking, replies, stream chunks and error objects.

Each reply carries llama.cpp's `timings` object (same names, same units) and Tandem's own `tandem`
object (GenerationStats.to_dict()), so a client can show the speculative stats of either server.

`seed` is a signed 64-bit integer (engine.settings.SEED_MIN..SEED_MAX); a wider one is refused with
400, never reduced onto another seed, so a seed the server takes always means itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.settings import SEED_MAX, SEED_MIN, SamplingSettings
from engine.stats import GenerationStats

# OpenAI finish reasons for Tandem's (a cancelled request has no client left to tell)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_tokens": "length", "cancelled": "stop"}
ROLES = ("system", "user", "assistant")
# OpenAI's newer name for the system message ("developer" instructions), which its clients now send
ROLE_ALIASES = {"developer": "system"}
# fields accepted with any value that changes nothing here
IGNORED_FIELDS = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
# fields accepted only at their neutral value (null, false, 0, 1 or empty)
NEUTRAL_FIELDS = {
    "n": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}
SUPPORTED_FIELDS = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
}


class ApiError(Exception):
    """An error answered as an OpenAI error object with an HTTP status."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    stream: bool
    include_usage: bool
    sampling: SamplingSettings


def parse_chat_request(
    body, model_name: str, defaults: SamplingSettings, context_length: int | None = None
) -> ChatRequest:
    """Checks a decoded request body; raises ApiError naming the offending field.

    Sampling fields a request leaves out take the server's defaults (`tandem-cli serve --temperature`...).
    A reply cannot be longer than the model's context, so `max_tokens` past `context_length` is refused.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    for name, value in body.items():
        if name in SUPPORTED_FIELDS or name in IGNORED_FIELDS:
            continue
        if name in NEUTRAL_FIELDS:
            if value not in NEUTRAL_FIELDS[name]:
                what = "More than one choice (n > 1)" if name == "n" else f"'{name}'"
                raise ApiError(
                    400, f"{what} is not supported by this server.", param=name, code="unsupported_field"
                )
            continue
        raise ApiError(400, f"Unknown or unsupported field '{name}'.", param=name, code="unsupported_field")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required.", param="model")
    if model != model_name:
        raise ApiError(
            404,
            f"The model '{model}' does not exist on this server; it serves '{model_name}'.",
            param="model",
            code="model_not_found",
        )
    messages = _messages(body.get("messages"))
    stream = _typed(body, "stream", bool, False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    max_tokens_name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = body.get(max_tokens_name)
    seed = body.get("seed")
    sampling = SamplingSettings(
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 5.0),
        top_p=_number(body, "top_p", defaults.top_p, 1e-9, 1.0),
        top_k=int(_number(body, "top_k", defaults.top_k, 0, 1e9, integer=True)),
        max_new_tokens=defaults.max_new_tokens
        if max_tokens is None
        else _max_tokens(max_tokens_name, max_tokens, context_length),
        seed=defaults.seed if seed is None else _checked_int("seed", seed, SEED_MIN, SEED_MAX),
        stop=_stop_strings(body.get("stop")),
    )
    return ChatRequest(model, messages, stream, bool(options.get("include_usage")), sampling)


def _max_tokens(name: str, value, context_length: int | None) -> int:
    value = _checked_int(name, value, 1)
    if context_length and value > context_length:
        raise ApiError(
            400,
            f"'{name}' must be at most {context_length}, the model's context length, not {value}.",
            param=name,
            code="max_tokens_exceeds_context",
        )
    return value


def _stop_strings(value) -> tuple[str, ...]:
    """OpenAI's `stop`: null, one string, or a list of up to 4 strings."""
    if value is None or value == "":
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 4 or not all(isinstance(s, str) for s in items):
        raise ApiError(400, "'stop' must be a string or a list of at most 4 strings.", param="stop")
    return tuple(s for s in items if s)


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    messages = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, dict) else None
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else None
        if role not in ROLES:
            raise ApiError(
                400,
                f"messages[{i}] needs a role: system, developer, user or assistant.",
                param=f"messages[{i}]",
            )
        content = message.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ApiError(
                    400, f"messages[{i}]: only text content is supported.", param=f"messages[{i}].content"
                )
            if not all(isinstance(p.get("text", ""), str) for p in content):
                raise ApiError(
                    400,
                    f"messages[{i}]: a text part's 'text' must be a string.",
                    param=f"messages[{i}].content",
                )
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs text content.", param=f"messages[{i}].content")
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
        raise ApiError(400, "The last message must be the user's.", param="messages")
    return messages


def _typed(body: dict, name: str, kind: type, default):
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ApiError(400, f"'{name}' must be a {kind.__name__}.", param=name)
    return value


def _checked_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise ApiError(400, f"'{name}' must be an integer {what}.", param=name)
    if maximum is not None and value > maximum:
        raise ApiError(
            400, f"'{name}' must be an integer from {minimum} to {maximum}, not {value}.", param=name
        )
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, integer: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        raise ApiError(400, f"'{name}' must be a number.", param=name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low:g} and {high:g}, not {value}.", param=name)
    return float(value)


# --- replies -------------------------------------------------------------------------------------


def timings(stats: GenerationStats) -> dict:
    """llama.cpp server's `timings` object for one reply (milliseconds, tokens per second)."""
    prompt_ms = stats.prefill_time_s * 1000
    predicted_ms = stats.decode_time_s * 1000
    result = {
        "cache_n": stats.prompt_tokens - stats.prefill_tokens,
        "prompt_n": stats.prefill_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / stats.prefill_tokens if stats.prefill_tokens else 0.0,
        "prompt_per_second": stats.prefill_tokens / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / stats.generated_tokens if stats.generated_tokens else 0.0,
        "predicted_per_second": stats.generated_tokens / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
    }
    if stats.drafter != "none":
        result.update(draft_n=stats.drafted, draft_n_accepted=stats.accepted)
    return result


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.prompt_tokens - stats.prefill_tokens},
    }


def tandem_fields(stats: GenerationStats) -> dict:
    """Tandem's own figures: every GenerationStats field plus mean accepted length and speed-up."""
    data = stats.to_dict()
    data["verify_forward_s"] = {str(k): v for k, v in data["verify_forward_s"].items()}
    data["source"] = "tandem-server"
    return data


def progress_fields(stats: GenerationStats) -> dict:
    """The small per-chunk subset of the stats, for live displays."""
    return {
        "drafter": stats.drafter,
        "rounds": stats.rounds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "generated_tokens": stats.generated_tokens,
        "current_k": stats.current_k,
    }


def completion(
    request_id: str, created: int, model: str, text: str, reason: str, stats: GenerationStats
) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": FINISH_REASONS.get(reason, reason),
                "logprobs": None,
            }
        ],
        "usage": usage(stats),
        "timings": timings(stats),
        "tandem": tandem_fields(stats),
    }


def chunk(request_id: str, created: int, model: str, delta: dict, finish_reason=None, **extra) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        **extra,
    }
