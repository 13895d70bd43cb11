"""transformers' from_pretrained as Tandem calls it: remote code refused, format errors typed."""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFormatError


def from_pretrained(loader, folder: Path, **kwargs):
    """transformers' from_pretrained with remote code refused and format errors made typed."""
    try:
        return loader.from_pretrained(str(folder), trust_remote_code=False, **kwargs)
    except ModelFormatError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        if "trust_remote_code" in str(exc) or "custom code" in str(exc):
            raise ModelFormatError(
                f"'{folder}' needs code shipped with the model to load; Tandem never runs model code. "
                "Choose a model whose architecture transformers supports natively."
            ) from exc
        raise ModelFormatError(f"Could not load the model in '{folder}': {exc}") from exc
