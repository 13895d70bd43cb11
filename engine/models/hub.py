"""Download a model from the Hugging Face hub into its normal cache.

huggingface_hub resumes interrupted downloads and only returns a snapshot whose files are all
present, so a partial download is never handed to the loader.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.errors import ModelNotFoundError, OfflineError, TandemError
from engine.events import ProgressCallback

# Weights as safetensors, configs, and every tokenizer file format; never pickle checkpoints.
ALLOW_PATTERNS = [
    "*.safetensors",
    "*.json",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
]
# Short, so an unplugged cable gives an answer in seconds, not a hang.
CONNECT_TIMEOUT_S = 5.0

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class DownloadCancelled(TandemError):
    pass


def looks_like_hub_id(spec: str) -> bool:
    return bool(HUB_ID.match(spec)) and not spec.endswith(".gguf")


def progress_bar_class(progress: ProgressCallback):
    """A tqdm class that forwards every update to progress(stage, done, total)."""
    from tqdm import tqdm

    class CallbackProgress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            kwargs["disable"] = False
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 (closed in close())
            super().__init__(*args, **kwargs)
            self._report()

        def _report(self):
            progress(str(self.desc or "Downloading").rstrip(": "), int(self.n), int(self.total or 0))

        def update(self, n=1):
            result = super().update(n)
            self._report()
            return result

        def refresh(self, *args, **kwargs):
            result = super().refresh(*args, **kwargs)
            self._report()
            return result

        def close(self):
            if self.disable:
                return
            handle = self.fp
            super().close()
            handle.close()

    return CallbackProgress


def network_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's error bases; huggingface_hub has used requests, httpx and httpx2."""
    import importlib

    errors = []
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def download_model(
    hub_id: str,
    progress: ProgressCallback | None = None,
    revision: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The local snapshot folder of `hub_id`, downloading what is missing.

    Raises OfflineError when the hub cannot be reached and the model is not (fully) cached,
    ModelNotFoundError when the hub says there is no such repository.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kwargs = {}
    if progress is not None:
        kwargs["tqdm_class"] = progress_bar_class(progress)
    try:
        folder = snapshot_download(
            hub_id,
            revision=revision,
            endpoint=endpoint,
            cache_dir=str(cache_dir) if cache_dir else None,
            allow_patterns=ALLOW_PATTERNS,
            etag_timeout=CONNECT_TIMEOUT_S,
            **kwargs,
        )
    except GatedRepoError as exc:
        raise ModelNotFoundError(
            f"'{hub_id}' is gated on the Hugging Face hub: accept its licence on the model page and "
            "log in with `hf auth login`, then try again."
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ModelNotFoundError(
            f"The Hugging Face hub has no model '{hub_id}'"
            + (f" at revision '{revision}'" if revision else "")
            + ". Check the spelling, or log in if it is private."
        ) from exc
    except IncompleteSnapshotError as exc:
        raise OfflineError(
            f"'{hub_id}' is only partly downloaded and is not available offline. "
            "Connect to the internet to finish the download (it resumes where it stopped)."
        ) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise OfflineError(
            f"'{hub_id}' is not available offline: the Hugging Face hub cannot be reached and the "
            "model is not in the local cache. Connect to the internet, or choose a local model folder."
        ) from exc
    except (HfHubHTTPError, *network_errors(), OSError) as exc:
        raise OfflineError(
            f"Downloading '{hub_id}' failed ({exc.__class__.__name__}: {exc}). The download resumes "
            "where it stopped when you try again."
        ) from exc
    return Path(folder)
