"""Managing models on disk: what is installed, downloading a suggested pair, removing a model, whether
a pair will fit, and the Hugging Face token for gated models.

Torch-free at import. The token goes where huggingface_hub keeps it (`hf auth login` writes the same
file, HF_HOME/token, readable by the user alone), so downloads use it without Tandem passing it on,
and it never enters the conversation database or Tandem's settings.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelNotFoundError, TandemError
from engine.models import catalog
from engine.models.hub import DownloadCancelled

GIB = 1024**3
# bytes per parameter of the weights, by what they are stored as
BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class InstalledModel:
    spec: str
    name: str
    source: str  # "builtin", "gguf-cache", "hub-cache", "hub-gguf" or "local"
    size_bytes: int | None
    folder: Path | None
    file: Path | None = None  # the GGUF file it runs from, when it runs from one

    @property
    def removable(self) -> bool:
        return self.source in ("gguf-cache", "hub-cache", "hub-gguf")

    @property
    def location(self) -> str:
        return str(self.file or self.folder or "")


@dataclass(frozen=True)
class SuggestedPair:
    target: str
    draft: str
    draft_quantization: str
    device: str
    name: str = ""  # the catalogue's words for it; else the two specs
    draft_cost_note: str = ""  # the catalogue's words for what drafting costs; else from the sizes
    head: str = ""  # a published draft head for the target

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        quantized = f" ({self.draft_quantization.upper()})" if self.draft_quantization != "none" else ""
        head = f" (or the EAGLE-3 head {self.head})" if self.head else ""
        return f"{self.target} + {self.draft}{quantized}{head}"


def installed_models() -> list[InstalledModel]:
    return [
        InstalledModel(e.spec, e.name, e.source, e.size_bytes, e.folder, e.file)
        for e in catalog.list_models(include_catalogue=False)
    ]


def suggested_pairs() -> list[SuggestedPair]:
    return [
        SuggestedPair(
            p["target"],
            p["draft"],
            p.get("draft_quantization", "none"),
            p.get("device", "cpu"),
            p.get("label", ""),
            p.get("draft_cost", ""),
            p.get("head", ""),
        )
        for p in catalog.load_catalogue()["pairs"]
    ]


def _weights_and_kv(spec: str) -> tuple[int | None, int | None]:
    """(bytes of weights, KV bytes per token) a catalogue model or the built-in one runs with on a CPU."""
    entries = {e.spec: e for e in catalog.list_models()}
    entry = entries.get(spec)
    suggested = {e.spec: e for e in catalog.catalogue_entries()}.get(spec)
    size = entry.size_bytes if entry is not None and entry.file is not None else None
    if size is None and suggested is not None:
        size = suggested.size_bytes
    return size, suggested.kv_bytes_per_token if suggested is not None else None


def is_gguf_pair(pair: SuggestedPair) -> bool:
    from engine.models.builtin import is_builtin
    from engine.models.gguf_hub import parse_spec

    return all(is_builtin(spec) or parse_spec(spec) is not None for spec in (pair.target, pair.draft))


def gguf_pair_estimate(pair: SuggestedPair, context: int, available: int | None = None):
    """Both files, both KV caches at `context` tokens and the runtime's overhead, against free memory.
    The built-in pair's draft is its head and lookups (a quantized copy of a GGUF target is no draft)."""
    from engine.models.memory import MIN_RUNTIME_OVERHEAD_BYTES, MemoryEstimate, available_memory_bytes

    parts = {}
    specs = (pair.target,) if pair.draft == pair.target else (pair.target, pair.draft)
    for role, spec in zip(("target", "draft"), specs, strict=False):
        size, per_token = _weights_and_kv(spec)
        parts[f"{role} weights"] = size or 0
        parts[f"{role} KV cache"] = (per_token or 0) * context
    weights = sum(b for label, b in parts.items() if "weights" in label)
    parts["runtime overhead"] = max(MIN_RUNTIME_OVERHEAD_BYTES, weights // 20)
    free = available_memory_bytes("cpu") if available is None else available
    return MemoryEstimate(parts, dict.fromkeys(parts, "cpu"), {"cpu": free}, context)


def draft_cost(pair: SuggestedPair) -> str:
    """What a draft token costs against a target step, in one line. On a CPU a decoding step reads every
    weight once, so a draft token costs about its file's share of the target's (an estimate)."""
    if pair.draft_cost_note:
        return pair.draft_cost_note
    if is_gguf_pair(pair):
        target, _ = _weights_and_kv(pair.target)
        draft, _ = _weights_and_kv(pair.draft)
    else:
        params = {e.spec: e.params for e in catalog.catalogue_entries()}
        target, draft = params.get(pair.target), params.get(pair.draft)
        if draft is not None and pair.draft_quantization in BYTES_PER_PARAM and target is not None:
            draft = draft * BYTES_PER_PARAM[pair.draft_quantization] / BYTES_PER_PARAM["bfloat16"]
    if not target or not draft:
        return "Unknown until both are downloaded."
    head = f"; or the EAGLE-3 head {pair.head}" if pair.head else ""
    return (
        f"A draft token costs about {draft / target:.0%} of a target step "
        f"({draft / GIB:.2f} GiB of weights read against {target / GIB:.2f} GiB; estimate){head}."
    )


def pair_fit(pair: SuggestedPair, device: str | None = None) -> str:
    """Will the pair fit here? From the configs when on disk, else from the catalogue's parameter
    counts (weights only, so the line says it is an estimate)."""
    from engine.models.gguf_hub import DEFAULT_CONTEXT
    from engine.models.loaded import resolve_device

    where = str(resolve_device(device or "auto").type)
    note = " Suggested for a GPU; this machine has none." if pair.device == "cuda" and where != "cuda" else ""
    if is_gguf_pair(pair) and where == "cpu":
        return gguf_pair_estimate(pair, DEFAULT_CONTEXT).summary
    return _fit_line(pair, where) + note


def _fit_line(pair: SuggestedPair, where: str) -> str:
    from engine.models.loading import load_config
    from engine.models.memory import available_memory_bytes, estimate_memory

    on_disk = {e.spec: e.folder for e in catalog.list_models(include_catalogue=False) if e.folder}
    if pair.target in on_disk and pair.draft in on_disk:  # never converts or downloads to answer
        try:
            estimate = estimate_memory(
                load_config(str(on_disk[pair.target])),
                load_config(str(on_disk[pair.draft])),
                device=where,
                draft_quantization=pair.draft_quantization,
            )
            return estimate.summary
        except TandemError:
            pass
    params = {e.spec: e.params for e in catalog.catalogue_entries()}
    if params.get(pair.target) is None or params.get(pair.draft) is None:
        return "Size unknown until downloaded."
    dtype = "bfloat16" if where == "cuda" else "float32"
    draft_format = pair.draft_quantization if pair.draft_quantization != "none" else dtype
    needed = params[pair.target] * BYTES_PER_PARAM[dtype] + params[pair.draft] * BYTES_PER_PARAM[draft_format]
    free = available_memory_bytes(where)
    verdict = "won't fit" if needed > free else ("tight" if needed > 0.8 * free else "fits")
    return (
        f"Weights about {needed / GIB:.1f} GiB ({free / GIB:.1f} GiB free on {where}): {verdict} (estimate)."
    )


def download_pair(pair: SuggestedPair, progress=None, cancel: threading.Event | None = None) -> list[Path]:
    """Download the target, then the draft (built-in ones are skipped); DownloadCancelled on cancel,
    OfflineError / ModelNotFoundError with a message when the hub cannot deliver."""
    from engine.models.builtin import is_builtin
    from engine.models.gguf_hub import parse_spec, resolve_spec
    from engine.models.hub import download_model

    def report(stage: str, done: int, total: int) -> None:
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled("Download cancelled; what arrived is kept and the next try resumes.")
        if progress is not None:
            progress(stage, done, total)

    folders = []
    for spec in dict.fromkeys((pair.target, pair.draft)):
        if is_builtin(spec):
            continue
        report(f"Downloading {spec}", 0, 0)
        try:
            if parse_spec(spec) is not None:  # a hub GGUF file: downloaded, checked, its path
                folders.append(Path(resolve_spec(spec, report)))
            else:
                folders.append(download_model(spec, report))
        except TandemError as error:
            if isinstance(error.__cause__, DownloadCancelled) or isinstance(error, DownloadCancelled):
                raise DownloadCancelled(str(error.__cause__ or error)) from None
            raise
    return folders


def remove_model(model: InstalledModel) -> None:
    """Delete a downloaded or converted model from Tandem's caches; other files are never touched."""
    if model.source == "builtin":
        raise ModelNotFoundError("The built-in model cannot be removed: it is Tandem's fallback.")
    if model.source == "local":
        raise ModelNotFoundError(
            f"{model.folder} is your own folder; Tandem does not delete it. Delete it in your file manager."
        )
    if model.source == "hub-cache":
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
        hashes = [r.commit_hash for repo in info.repos if repo.repo_id == model.spec for r in repo.revisions]
        info.delete_revisions(*hashes).execute()
        return
    if model.source == "hub-gguf" and model.file is not None:  # the snapshot's link and the file it names
        blob = model.file.resolve()
        model.file.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        return
    if model.folder is not None and model.folder.is_dir():
        shutil.rmtree(model.folder)


def token_path() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH)


def save_hf_token(token: str) -> Path:
    """Keep a Hugging Face token where huggingface_hub reads it (mode 0600); returns the file."""
    token = token.strip()
    if not token.startswith("hf_"):
        raise TandemError(
            "A Hugging Face token starts with 'hf_'. Copy it from huggingface.co/settings/tokens."
        )
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token)
    os.replace(temp, path)
    return path


def forget_hf_token() -> None:
    token_path().unlink(missing_ok=True)


def has_hf_token() -> bool:
    return token_path().is_file()
