"""What a server's answers must look like before the remote client reads them, and how much of one it
reads: the model list, a stream chunk (or a whole reply from a server that does not stream), in the
OpenAI format with llama.cpp's `timings` and Tandem's `tandem` stats. A field of the wrong type or an
over-long line is a RemoteProtocolError that names the field, never a traceback.

Fields the client does not read are ignored, so any OpenAI-compatible server's extras pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, StrictStr, TypeAdapter, ValidationError

from engine.remote.errors import RemoteProtocolError
from engine.stats import GenerationStats

MAX_LINE_BYTES = 1 << 20  # a stream line (one chunk) longer than this is refused, not buffered
MAX_BODY_BYTES = 16 << 20  # a whole JSON answer: the model list, a reply that is not streamed
MAX_ERROR_BYTES = 64 << 10  # an error body: what is past this is not read
LINE_END = re.compile(rb"\r\n|\r|\n")
STAT_FIELDS = {f.name for f in fields(GenerationStats)}


class ModelEntry(BaseModel):
    id: StrictStr


class ModelList(BaseModel):
    data: list[ModelEntry]


class Delta(BaseModel):
    content: StrictStr | None = None


class Choice(BaseModel):
    delta: Delta | None = None
    message: Delta | None = None  # a whole reply, from a server that did not stream
    finish_reason: StrictStr | None = None


class Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Timings(BaseModel):
    """llama.cpp's server: counts and milliseconds of the prompt and the generation, and its drafts."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    cache_n: int | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None


class Chunk(BaseModel):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    tandem: dict[str, Any] | None = None
    error: Any = None


_STATS = TypeAdapter(GenerationStats)


def parse_models(body: bytes, where: str) -> list[str]:
    """The model ids of a /v1/models answer."""
    return [entry.id for entry in _validated(ModelList, _json(body, where), where).data]


def parse_chunk(payload: str | bytes, where: str) -> Chunk:
    """One stream chunk, or a whole reply; its `tandem` stats checked field by field."""
    chunk = _validated(Chunk, _json(payload, where), where)
    if chunk.tandem is not None:
        given = {key: value for key, value in chunk.tandem.items() if key in STAT_FIELDS}
        try:
            stats = _STATS.validate_python(given)
        except ValidationError as error:
            raise RemoteProtocolError(f"{where} sent Tandem stats {_first_problem(error)}.") from None
        chunk.tandem = {key: getattr(stats, key) for key in given}
    return chunk


def bounded_lines(chunks: Iterable[bytes], where: str, limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a byte stream, refusing one longer than `limit` before buffering more of it."""
    pending = b""
    for data in chunks:
        *lines, pending = LINE_END.split(pending + data)
        for line in lines:
            if len(line) > limit:
                raise _too_long(where, limit)
            yield line.decode("utf-8", errors="replace")
        if len(pending) > limit:
            raise _too_long(where, limit)
    if pending:
        yield pending.decode("utf-8", errors="replace")


def read_bounded(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of a body, and whether there was more (which is not read)."""
    body = b""
    for data in chunks:
        body += data
        if len(body) > limit:
            return body[:limit], True
    return body, False


def _too_long(where: str, limit: int) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"{where} sent a stream line longer than {limit >> 20} MiB: it is not an OpenAI-compatible stream."
    )


def _json(payload: str | bytes, where: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise RemoteProtocolError(f"{where} sent something that is not JSON.") from None


def _validated(shape: type[BaseModel], data: Any, where: str):
    try:
        return shape.model_validate(data)
    except ValidationError as error:
        raise RemoteProtocolError(
            f"{where} sent an answer that is not in the OpenAI format: {_first_problem(error)}."
        ) from None


def _first_problem(error: ValidationError) -> str:
    """Where the first problem is and what it is ("choices.0.delta: Input should be ..."): field names
    and pydantic's words only, never the server's values."""
    problem = error.errors(include_url=False, include_input=False)[0]
    location = ".".join(str(part) for part in problem["loc"]) or "the answer"
    return f"{location}: {problem['msg']}"
