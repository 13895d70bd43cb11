"""Reading a request body: JSON only, bounded in size, time, element count and nesting, with text that
is valid Unicode.

Each limit is checked before the next step can fail on it or take long, so a client's mistake is a 4xx
error object, never a 500, and no body holds up the other clients:
  - the Content-Type must be application/json (415): a web page can send `text/plain` to the loopback
    without asking first (a CORS "simple request"), but not JSON;
  - at most MAX_BODY_BYTES, counted while reading, also without a Content-Length (413), and all of it
    within BODY_TIMEOUT_S of the headers (408), so a client trickling its body in cannot hold a request
    open; a client that hangs up during its upload is `ClientGone`, not a server error;
  - the rest runs on a worker thread, so the event loop (other clients' streams, /health) goes on:
  - at most MAX_ELEMENTS arrays, objects and items after a comma (about as many values), counted with
    bytes.count before anything is parsed: json.loads holds the interpreter lock however it is called,
    and 1.3 million tiny arrays took it and the checks after it 7 s; MAX_ELEMENTS of them take a few
    tens of milliseconds (400);
  - at most MAX_DEPTH levels of arrays and objects, measured before parsing: Python's parser recurses
    once per level, and a body nested 100,000 deep would end in a RecursionError (400);
  - JSON escapes can spell a lone surrogate ("\\ud800"), which no tokenizer or database takes (400).
"""

from __future__ import annotations

import json
import re

import anyio
from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from engine.server.schemas import ApiError

MAX_BODY_BYTES = 8 * 1024 * 1024
BODY_TIMEOUT_S = 60.0  # the whole body, from the end of the headers: 8 MiB at 140 kB/s
# a chat request holds some tens of values per message; 100,000 parse and check in about 50 ms
MAX_ELEMENTS = 100_000
MAX_DEPTH = 64
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # the unrolled form: linear, and fast
_BRACKETS = re.compile(rb"[\[\]{}]")
# what a body needs to hold a lone surrogate once decoded: a \uD800-\uDFFF escape, UTF-8 bytes of a
# surrogate (json.loads decodes with "surrogatepass"), or a zero byte (a UTF-16 or UTF-32 body)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")


class ClientGone(Exception):
    """The client hung up before its request was read."""


async def read_json(request: Request, timeout_s: float = BODY_TIMEOUT_S):
    """The request's JSON body, decoded and checked; ApiError for a client's mistake, ClientGone for a
    client that left during its upload."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        shown = f"'{media_type}'" if media_type else "none"
        raise ApiError(
            415,
            f"Send the body as JSON, with the header Content-Type: application/json (it was {shown}).",
            code="unsupported_media_type",
        )
    try:
        with anyio.fail_after(timeout_s):
            raw = await _read_bounded(request)
    except TimeoutError:
        raise ApiError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None
    except ClientDisconnect:
        raise ClientGone from None
    return await run_in_threadpool(decode_body, raw)


async def _read_bounded(request: Request) -> bytes:
    too_large = ApiError(
        413,
        f"The request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB.",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(raw: bytes):
    """`raw` decoded and checked, the cheap limits first; ApiError for a client's mistake."""
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets + raw.count(b",") > MAX_ELEMENTS or brackets > MAX_DEPTH:
        # brackets and commas inside strings count only while the total is under the limits
        outside = without_strings(raw)
        if outside is None or elements_exceed(outside, MAX_ELEMENTS):
            raise ApiError(
                400,
                f"The request body holds too many JSON values: more than {MAX_ELEMENTS:,} arrays, "
                "objects and items after a comma.",
                code="invalid_json",
            )
        if nesting_exceeds(outside, MAX_DEPTH):
            raise ApiError(
                400,
                f"The request body nests arrays or objects more than {MAX_DEPTH} levels deep.",
                code="invalid_json",
            )
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(400, f"The request body is not valid JSON: {error}.", code="invalid_json") from None
    except ValueError:  # Python reads integers of at most 4300 digits
        raise ApiError(
            400, "The request body holds a number too long to read.", code="invalid_json"
        ) from None
    found = invalid_text_at(body) if may_hold_a_surrogate(raw) else None
    if found is not None:
        path, is_key, char, position = found
        where = f"'{path}'" if path else "the request body"
        where = f"A key in {where}" if is_key else where[0].upper() + where[1:]
        raise ApiError(
            400,
            f"{where} is not valid Unicode text: it holds a lone surrogate (U+{char:04X} at position "
            f"{position}), an escape such as \\ud800 without its pair. Send UTF-8 text.",
            param=path or None,
            code="invalid_text",
        )
    return body


def may_hold_a_surrogate(raw: bytes) -> bool:
    """Whether decoding `raw` can give a lone surrogate; most bodies are ruled out by a byte search."""
    return (
        (b"\\u" in raw and _SURROGATE_ESCAPE.search(raw) is not None)
        or (b"\xed" in raw and _SURROGATE_UTF8.search(raw) is not None)
        or b"\x00" in raw
    )


def without_strings(raw: bytes) -> bytes | None:
    """`raw` with its JSON strings cut out, or None where it holds more strings than MAX_ELEMENTS
    allows (each key and each value is at most one), which would make cutting them out slow."""
    if (raw.count(b'"') - raw.count(b'\\"')) // 2 > 2 * MAX_ELEMENTS:
        return None
    return _STRINGS.sub(b"", raw)


def elements_exceed(outside: bytes, limit: int) -> bool:
    """Whether the JSON `outside` (its strings cut out) holds more than `limit` arrays, objects and items
    after a comma: about its number of values, counted without parsing it."""
    return outside.count(b"[") + outside.count(b"{") + outside.count(b",") > limit


def nesting_exceeds(outside: bytes, limit: int) -> bool:
    """Whether arrays and objects in the JSON `outside` (its strings cut out) nest deeper than `limit`."""
    depth = 0
    for bracket in _BRACKETS.findall(outside):
        depth += 1 if bracket in b"[{" else -1
        if depth > limit:
            return True
    return False


def invalid_text_at(value) -> tuple[str, bool, int, int] | None:
    """The first string of a decoded body that is not valid Unicode: where it is (`messages[0].content`,
    or for a key the path of its object), whether it is a key, the offending code point and its
    position; None when every string is valid. Iterative, so a deep body costs no recursion."""
    pending = [("", value)]
    while pending:
        path, item = pending.pop()
        children = []
        if isinstance(item, str):
            if (bad := _lone_surrogate(item)) is not None:
                return path, False, *bad
        elif isinstance(item, dict):
            for key, child in item.items():
                if (bad := _lone_surrogate(key)) is not None:
                    return path, True, *bad
                children.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            children = [(f"{path}[{i}]", child) for i, child in enumerate(item)]
        pending.extend(reversed(children))
    return None


def _lone_surrogate(text: str) -> tuple[int, int] | None:
    """(code point, position) of the first character UTF-8 cannot encode, or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return ord(text[error.start]), error.start
    return None
