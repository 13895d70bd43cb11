"""Where Tandem keeps its files. TANDEM_CACHE_DIR / TANDEM_DATA_DIR override the platform defaults.

A folder Tandem cannot create or write to (a read-only disk, another user's folder) is a
ReadOnlyStorageError naming the folder and the variable that points Tandem elsewhere.
"""

import os
from pathlib import Path

import platformdirs

from engine.errors import ReadOnlyStorageError

APP_NAME = "tandem"


def writable_folder(path: Path, what: str, variable: str) -> Path:
    """`path`, created if missing; ReadOnlyStorageError when it cannot be created or written to."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
        reason = "a read-only disk" if os.statvfs(path).f_flag & os.ST_RDONLY else "permission denied"
    except OSError as exc:
        writable, reason = False, (exc.strerror or str(exc)).lower()
    if not writable:
        raise ReadOnlyStorageError(
            f"Tandem cannot write to its {what} {path} ({reason}). Set {variable} to a folder you can "
            "write to, or make this one writable."
        )
    return path


def cache_dir() -> Path:
    path = Path(os.environ.get("TANDEM_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))
    return writable_folder(path, "cache folder", "TANDEM_CACHE_DIR")


def data_dir() -> Path:
    path = Path(os.environ.get("TANDEM_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))
    return writable_folder(path, "data folder", "TANDEM_DATA_DIR")


def config_dir() -> Path:
    path = Path(os.environ.get("TANDEM_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))
    return writable_folder(path, "settings folder", "TANDEM_CONFIG_DIR")


def models_cache_dir() -> Path:
    return writable_folder(cache_dir() / "models", "model cache folder", "TANDEM_CACHE_DIR")


def default_db_path() -> Path:
    return data_dir() / "tandem.db"
