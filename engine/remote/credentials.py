"""API keys for servers, kept outside the conversation database.

The OS keyring (through `keyring`) holds them where a real keyring backend exists: Keychain on macOS,
Credential Locker on Windows, Secret Service or KWallet on Linux desktops. Elsewhere (a headless
machine, a container) they go to `config_dir()/credentials.json`, readable by the user alone (0600).
TANDEM_CREDENTIALS=file forces the file.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from engine.errors import StorageError
from engine.paths import config_dir

SERVICE = "tandem"
FILE_NAME = "credentials.json"


def _keyring():
    """The keyring module when a usable backend exists, else None."""
    if os.environ.get("TANDEM_CREDENTIALS") == "file":
        return None
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
        return None
    return keyring


def credentials_path() -> Path:
    return config_dir() / FILE_NAME


def credential_store() -> str:
    """Where keys are kept, for the settings panel to say."""
    keyring = _keyring()
    if keyring is not None:
        return f"system keyring ({type(keyring.get_keyring()).__name__})"
    return f"file {credentials_path()} (readable by you only)"


def _key_name(base_url: str) -> str:
    return base_url.rstrip("/")


def save_api_key(base_url: str, key: str) -> None:
    keyring = _keyring()
    if keyring is not None:
        keyring.set_password(SERVICE, _key_name(base_url), key)
        return
    keys = _read_file()
    keys[_key_name(base_url)] = key
    _write_file(keys)


def load_api_key(base_url: str) -> str | None:
    keyring = _keyring()
    if keyring is not None:
        return keyring.get_password(SERVICE, _key_name(base_url))
    return _read_file().get(_key_name(base_url))


def delete_api_key(base_url: str) -> None:
    keyring = _keyring()
    if keyring is not None:
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            keyring.delete_password(SERVICE, _key_name(base_url))
        return
    keys = _read_file()
    if keys.pop(_key_name(base_url), None) is not None:
        _write_file(keys)


def _read_file() -> dict[str, str]:
    path = credentials_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise StorageError(
            f"Cannot read saved API keys from {path}: {error}. Delete the file to start over."
        ) from None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_file(keys: dict[str, str]) -> None:
    """Atomic, and never readable by others: the temporary file is created 0600, then renamed."""
    path = credentials_path()
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(keys, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as error:
        raise StorageError(f"Cannot save the API key to {path}: {error.strerror or error}.") from None
