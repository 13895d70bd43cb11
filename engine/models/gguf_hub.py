"""GGUF files from a Hugging Face hub repository, offered as LM Studio offers them: each quantization
with its size and whether it fits in this machine's memory at a chosen context, downloaded with
progress, cancel and a checksum check.

A spec names one: `owner/repo:Q4_K_M` (the repository's file of that quantization) or
`owner/repo/file.gguf`. A file is downloaded into a partial file in Tandem's model cache that a
cancel, a killed process or a lost connection leaves in place, and the next download continues it
with a Range request (`partial_download`; huggingface_hub 2 deletes its own partial file whenever a
download stops, with or without `local_dir=`). The partial file is named by the file's SHA-256, so a
changed upstream file starts over. The whole file's SHA-256 is compared with the hub's LFS oid
before it moves into huggingface_hub's usual cache, where `hf_hub_download` links it into the
snapshot folder; a mismatch deletes the partial file. A marker in Tandem's cache remembers a file
that passed, so the check runs once per file.

The KV cache a file needs per token is read from the first bytes of its GGUF header (its
architecture keys come before the tokenizer's tables), by one Range request per repository.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFormatError, ModelNotFoundError, OfflineError, TandemError
from engine.events import ProgressCallback
from engine.models import partial_download
from engine.models.hub import CONNECT_TIMEOUT_S, DownloadCancelled, network_errors
from engine.paths import models_cache_dir

SPLIT = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[0-9A-Za-z]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
QUANT_SPEC = re.compile(rf"^(?P<repo>{REPO}):(?P<quant>[A-Za-z0-9_]+)$")
FILE_SPEC = re.compile(rf"^(?P<repo>{REPO})/(?P<file>[^:]+\.gguf)$", re.IGNORECASE)
# Files beside the weights that are no language model of their own (vision projectors).
NOT_MODELS = re.compile(r"mmproj", re.IGNORECASE)
HEADER_PROBE_BYTES = 1024 * 1024  # the architecture keys lie in the first few kilobytes
KV_BYTES_PER_ELEMENT = 4  # Tandem keeps a CPU reply's KV cache in fp32
DEFAULT_CONTEXT = 8192
HASH_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class HubGGUF:
    """One downloadable model of a repository: a .gguf file, or the parts of a split one."""

    repo: str
    revision: str  # the commit it was listed at
    files: tuple[str, ...]
    quant: str
    size_bytes: int
    sha256: tuple[str | None, ...]

    @property
    def split(self) -> bool:
        return len(self.files) > 1

    @property
    def name(self) -> str:
        if not self.split:
            return self.files[0]
        return f"{SPLIT.match(self.files[0])['base']}.gguf ({len(self.files)} parts)"

    @property
    def spec(self) -> str:
        return f"{self.repo}/{self.files[0]}"


def quant_of(filename: str) -> str:
    """The quantization a GGUF file name says (Q4_K_M, Q8_0, IQ4_XS, F16…), or "?"."""
    stem = Path(filename).name
    match = SPLIT.match(stem)
    stem = match["base"] if match else stem.removesuffix(".gguf").removesuffix(".GGUF")
    found = QUANT.findall(stem)
    return found[-1].upper() if found else "?"


def group_files(repo: str, revision: str, siblings) -> list[HubGGUF]:
    """The repository's .gguf files as models, a split file's parts as one; smallest first."""
    singles, parts = [], {}
    for sibling in siblings:
        name = sibling.rfilename
        if not name.lower().endswith(".gguf") or NOT_MODELS.search(Path(name).name):
            continue
        sha = sibling.lfs.sha256 if sibling.lfs else None
        size = sibling.lfs.size if sibling.lfs else (sibling.size or 0)
        match = SPLIT.match(name)
        if match:
            parts.setdefault((match["base"], match["count"]), []).append(
                (int(match["part"]), name, size, sha)
            )
        else:
            singles.append(HubGGUF(repo, revision, (name,), quant_of(name), size, (sha,)))
    for (_base, count), found in parts.items():
        found.sort()
        if len(found) != int(count):
            continue  # an incomplete upload cannot be loaded
        files = tuple(name for _, name, _, _ in found)
        singles.append(
            HubGGUF(
                repo,
                revision,
                files,
                quant_of(files[0]),
                sum(s for *_, s, _ in found),
                tuple(h for *_, h in found),
            )
        )
    return sorted(singles, key=lambda entry: (entry.size_bytes, entry.name))


def endpoint() -> str | None:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT") or None


def _hub_errors(repo: str, action: str):
    """Turn huggingface_hub's exceptions into one-line TandemErrors for `repo`."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def translate(exc: BaseException) -> TandemError | None:
        where = endpoint() or "huggingface.co"
        if isinstance(exc, GatedRepoError):
            return ModelNotFoundError(
                f"'{repo}' is gated on the Hugging Face hub: accept its licence on the model page and "
                "save your token in Chat ▸ Models… (or `hf auth login`), then try again."
            )
        if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError)):
            return ModelNotFoundError(
                f"The Hugging Face hub has no '{repo}'{' file' if isinstance(exc, EntryNotFoundError) else ''}. "
                "Check the spelling, or save your token if it is private."
            )
        if isinstance(exc, OfflineModeIsEnabled):
            return OfflineError(f"Cannot {action} '{repo}' offline: HF_HUB_OFFLINE is set.")
        if isinstance(exc, LocalEntryNotFoundError):
            return OfflineError(
                f"Cannot {action} '{repo}': the Hugging Face hub ({where}) cannot be reached (offline?)."
            )
        if isinstance(exc, (HfHubHTTPError, *network_errors(), OSError)):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
            return OfflineError(
                f"Cannot {action} '{repo}': the Hugging Face hub ({where}) did not answer (offline? {first[:160]})."
            )
        return None

    return translate


def list_gguf_files(repo: str) -> list[HubGGUF]:
    """Every .gguf model in the repository with its quantization, size and SHA-256."""
    from huggingface_hub import HfApi

    translate = _hub_errors(repo, "list the files of")
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo, files_metadata=True, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:
        error = translate(exc)
        if error is None:
            raise
        raise error from exc
    found = group_files(repo, info.sha or "main", info.siblings or [])
    if not found:
        raise ModelNotFoundError(f"'{repo}' holds no .gguf file. Choose a repository of GGUF files (…-GGUF).")
    return found


# ---- will it fit ---------------------------------------------------------------------------------


def kv_bytes_per_token(metadata: dict) -> int | None:
    """Bytes of KV cache one token takes, from a GGUF header's architecture keys; None if unknown."""
    arch = metadata.get("general.architecture")
    layers = metadata.get(f"{arch}.block_count")
    heads = metadata.get(f"{arch}.attention.head_count")
    kv_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
    width = metadata.get(f"{arch}.embedding_length")
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, kv_heads, width)):
        return None
    key = metadata.get(f"{arch}.attention.key_length") or width // heads
    value = metadata.get(f"{arch}.attention.value_length") or width // heads
    return layers * kv_heads * (key + value) * KV_BYTES_PER_ELEMENT


def header_metadata(head: bytes) -> dict:
    """The scalar metadata in the first bytes of a GGUF file, as far as they reach."""
    from engine.models.gguf_file import _ARRAY, MAGIC, _Cursor

    if head[:4] != MAGIC:
        return {}
    cursor, metadata = _Cursor(memoryview(head), Path("header")), {}
    cursor.at = 8
    try:
        _tensors, count = cursor.take("<Q"), cursor.take("<Q")
        for _ in range(count):
            key, kind = cursor.string(), cursor.take("<I")
            if kind == _ARRAY:
                cursor.skip_array()
            else:
                metadata[key] = cursor.value(kind)
    except (ModelFormatError, struct.error):
        pass  # the probe ended inside the header: what was read is enough or nothing is
    return metadata


def remote_kv_bytes_per_token(entry: HubGGUF) -> int | None:
    """KV bytes per token of a hub file, from the first bytes of its header; None if unreadable."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(entry.repo, entry.files[0], revision=entry.revision, endpoint=endpoint())
    headers = {**build_hf_headers(), "Range": f"bytes=0-{HEADER_PROBE_BYTES - 1}"}
    try:
        response = get_session().get(url, headers=headers, follow_redirects=True, timeout=CONNECT_TIMEOUT_S)
        if response.status_code not in (200, 206):
            return None
        return kv_bytes_per_token(header_metadata(response.content[:HEADER_PROBE_BYTES]))
    except (*network_errors(), OSError):
        return None


def file_fit(size_bytes: int, kv_per_token: int | None, context: int, available: int | None = None):
    """A MemoryEstimate for running a file of `size_bytes` at `context` tokens on this CPU."""
    from engine.models.memory import MIN_RUNTIME_OVERHEAD_BYTES, MemoryEstimate, available_memory_bytes

    parts = {
        "weights (the file)": size_bytes,
        "runtime overhead": max(MIN_RUNTIME_OVERHEAD_BYTES, size_bytes // 20),
    }
    if kv_per_token is not None:
        parts["KV cache"] = kv_per_token * context
    free = available_memory_bytes("cpu") if available is None else available
    return MemoryEstimate(parts, dict.fromkeys(parts, "cpu"), {"cpu": free}, context)


def fit_line(estimate, kv_known: bool = True) -> str:
    return estimate.summary if kv_known else estimate.summary.rstrip(".") + " (KV cache unknown)."


# ---- download ------------------------------------------------------------------------------------


def _marker(sha256: str) -> Path:
    return models_cache_dir() / "hub-gguf-verified" / sha256


def _verified(path: Path, sha256: str) -> bool:
    stat = path.stat()
    try:
        return _marker(sha256).read_text() == f"{stat.st_size} {stat.st_mtime_ns}"
    except OSError:
        return False


def _digest(path: Path, name: str, report: ProgressCallback) -> str:
    digest, size, done = hashlib.sha256(), path.stat().st_size, 0
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            report(f"Checking {name}", done, size)
    return digest.hexdigest()


def _remember(path: Path, sha256: str) -> None:
    stat = path.stat()
    _marker(sha256).parent.mkdir(parents=True, exist_ok=True)
    _marker(sha256).write_text(f"{stat.st_size} {stat.st_mtime_ns}")


def _damaged(name: str, digest: str, sha256: str, deleted: str) -> ModelFormatError:
    return ModelFormatError(
        f"The download of {name} is damaged: its SHA-256 is {digest[:12]}…, the hub lists "
        f"{sha256[:12]}…. {deleted} was deleted; download it again (from the first byte)."
    )


def verify(path: Path, sha256: str | None, name: str, report: ProgressCallback) -> None:
    """Compare the downloaded file with the hub's SHA-256; a damaged file is deleted and refused."""
    if sha256 is None or _verified(path, sha256):
        return
    digest = _digest(path, name, report)
    if digest != sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise _damaged(name, digest, sha256, "The file")
    _remember(path, sha256)


def _fetch(entry: HubGGUF, name: str, sha256: str | None, report: ProgressCallback) -> Path:
    """The file in the hub cache, continuing its partial file; checked when its SHA-256 is known."""
    from huggingface_hub import (
        constants,
        get_hf_file_metadata,
        hf_hub_download,
        hf_hub_url,
        try_to_load_from_cache,
    )

    cached = try_to_load_from_cache(entry.repo, name, revision=entry.revision)
    if isinstance(cached, str):
        return Path(cached)
    url = hf_hub_url(entry.repo, name, revision=entry.revision, endpoint=endpoint())
    metadata = get_hf_file_metadata(url, timeout=CONNECT_TIMEOUT_S)
    storage = Path(constants.HF_HUB_CACHE) / f"models--{entry.repo.replace('/', '--')}"
    blob = storage / "blobs" / metadata.etag
    if not blob.exists():
        part = partial_download.partial_path(entry.repo, name, sha256 or metadata.etag)
        with partial_download.PartialLock(part, name):
            partial_download.drop_other_versions(part)
            partial_download.fetch(
                url, part, metadata.size, lambda done, total: report(f"Downloading {name}", done, total)
            )
            digest = None if sha256 is None else _digest(part, name, report)
            if digest != sha256:
                part.unlink(missing_ok=True)
                raise _damaged(name, digest, sha256, "The partial file")
            partial_download.place(part, blob)
        if sha256 is not None:
            _remember(blob, sha256)
    # the blob is in place: huggingface_hub links it into the snapshot folder without downloading it
    return Path(
        hf_hub_download(
            entry.repo, name, revision=entry.revision, endpoint=endpoint(), etag_timeout=CONNECT_TIMEOUT_S
        )
    )


def download(
    entry: HubGGUF, progress: ProgressCallback | None = None, cancel: threading.Event | None = None
) -> Path:
    """Download the file (every part of a split one) and check it; the first part's local path.

    DownloadCancelled when `cancel` is set (checked at every progress report; the bytes that arrived
    are kept for the next download), ModelFormatError for a damaged file, OfflineError /
    ModelNotFoundError with a one-line message when the hub cannot deliver.
    """
    paths = []
    for index, (name, sha256) in enumerate(zip(entry.files, entry.sha256, strict=True)):
        part = f" (part {index + 1} of {len(entry.files)})" if entry.split else ""

        def report(stage: str, done: int, total: int, part=part) -> None:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(
                    f"Download of {entry.name} cancelled; what arrived is kept and the next download continues it."
                )
            if progress is not None:
                progress(stage + part, done, total)

        report(f"Downloading {name}", 0, 0)
        translate = _hub_errors(entry.repo, f"download {name} from")
        try:
            path = _fetch(entry, name, sha256, report)
        except TandemError:
            raise
        except Exception as exc:
            error = translate(exc)
            if error is None:
                raise
            raise error from exc
        verify(path, sha256, name, report)
        paths.append(path)
    return paths[0]


# ---- specs ---------------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, str | None, str | None] | None:
    """(repo, quant, file) for `owner/repo:QUANT` or `owner/repo/file.gguf`; None for any other spec."""
    if (match := QUANT_SPEC.match(spec)) is not None:
        return match["repo"], match["quant"].upper(), None
    if (match := FILE_SPEC.match(spec)) is not None:
        return match["repo"], None, match["file"]
    return None


def is_hub_gguf_spec(spec: str) -> bool:
    return parse_spec(spec) is not None and not Path(spec).expanduser().exists()


def cached_file(spec: str) -> Path | None:
    """The checked local copy of a hub GGUF spec's file where it was downloaded already; else None."""
    parsed = parse_spec(spec)
    return None if parsed is None else _cached(*parsed)


def choose(entries: list[HubGGUF], repo: str, quant: str | None, file: str | None) -> HubGGUF:
    for entry in entries:
        if (file is not None and file in entry.files) or (quant is not None and entry.quant == quant):
            return entry
    offered = ", ".join(dict.fromkeys(e.quant for e in entries))
    wanted = file if file is not None else quant
    raise ModelNotFoundError(f"'{repo}' has no GGUF file {wanted}; it offers {offered}.")


def _cached(repo: str, quant: str | None, file: str | None) -> Path | None:
    """A checked copy of the spec's file already in the hub cache, found without the network."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "snapshots"
    for path in sorted(snapshots.glob("*/*.gguf")) if snapshots.is_dir() else []:
        if SPLIT.match(path.name) or not (
            (file and path.name == file) or (quant and quant_of(path.name) == quant)
        ):
            continue
        marker_name = path.resolve().name  # the blob is named by its SHA-256
        if path.is_file() and _verified(path, marker_name):
            return path
    return None


def resolve_spec(spec: str, progress: ProgressCallback | None = None) -> str:
    """The local path of a hub GGUF spec, downloaded and checked if it is not yet; other specs as they are."""
    parsed = parse_spec(spec)
    if parsed is None or Path(spec).expanduser().exists():
        return spec
    repo, quant, file = parsed
    cached = _cached(repo, quant, file)
    if cached is not None:
        return str(cached)
    entry = choose(list_gguf_files(repo), repo, quant, file)
    if entry.split:
        raise ModelFormatError(
            f"{entry.name} is split into {len(entry.files)} files, and Tandem runs single-file GGUFs. "
            "Choose another quantization, or join the parts with llama.cpp's `llama-gguf-split --merge`."
        )
    return str(download(entry, progress))
