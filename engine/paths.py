"""Where Tandem keeps its files. TANDEM_CACHE_DIR / TANDEM_DATA_DIR override the platform defaults."""

import os
from pathlib import Path

import platformdirs

APP_NAME = "tandem"


def cache_dir() -> Path:
    path = Path(os.environ.get("TANDEM_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    path = Path(os.environ.get("TANDEM_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    path = Path(os.environ.get("TANDEM_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_cache_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_db_path() -> Path:
    return data_dir() / "tandem.db"
