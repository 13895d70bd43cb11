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
    source: str  # "builtin", "gguf-cache", "hub-cache" or "local"
    size_bytes: int | None
    folder: Path | None

    @property
    def removable(self) -> bool:
        return self.source in ("gguf-cache", "hub-cache")


@dataclass(frozen=True)
class SuggestedPair:
    target: str
    draft: str
    draft_quantization: str
    device: str

    @property
    def label(self) -> str:
        quantized = f" ({self.draft_quantization.upper()})" if self.draft_quantization != "none" else ""
        return f"{self.target} + {self.draft}{quantized}"


def installed_models() -> list[InstalledModel]:
    return [
        InstalledModel(e.spec, e.name, e.source, e.size_bytes, e.folder)
        for e in catalog.list_models(include_catalogue=False)
    ]


def suggested_pairs() -> list[SuggestedPair]:
    return [
        SuggestedPair(p["target"], p["draft"], p.get("draft_quantization", "none"), p.get("device", "cpu"))
        for p in catalog.load_catalogue()["pairs"]
    ]


def pair_fit(pair: SuggestedPair, device: str | None = None) -> str:
    """Will the pair fit here? From the configs when on disk, else from the catalogue's parameter
    counts (weights only, so the line says it is an estimate)."""
    from engine.models.loaded import resolve_device

    where = str(resolve_device(device or "auto").type)
    note = " Suggested for a GPU; this machine has none." if pair.device == "cuda" and where != "cuda" else ""
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
