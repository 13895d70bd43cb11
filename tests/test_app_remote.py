"""The app on 'a server': settings keep the API key out of the database and the settings, and the
window answers through a real `tandem-cli serve` on the loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from app.config import STORE_KEY, AppConfig
from app.main_window import MainWindow
from app.settings_dialog import SettingsDialog

API_KEY = "sk-app-remote-5e0b"
KEY_ENV = "TANDEM_APP_TEST_SERVER_KEY"
START_TIMEOUT_S = 300
TIMEOUT_MS = 180_000
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


@pytest.fixture(scope="module")
def server_url():
    """A real `tandem-cli serve` (built-in model, n-gram drafter) that wants API_KEY."""
    env = {**os.environ, KEY_ENV: API_KEY}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine.cli.main",
            "serve",
            "--draft",
            "ngram",
            "--port",
            "0",
            "--max-new-tokens",
            "8",
            "--api-key-env",
            KEY_ENV,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    found: list[str] = []

    def read() -> None:
        for line in process.stdout:
            if line.startswith("Listening on "):
                found.append(line.split()[-1])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    try:
        assert found, "tandem-cli serve did not start"
        yield found[0]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture
def credentials_dir(tmp_path, monkeypatch):
    folder = tmp_path / "config"
    monkeypatch.setenv("TANDEM_CREDENTIALS", "file")
    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(folder))
    return folder


def choose_server(qtbot, store, url: str, key: str) -> AppConfig:
    dialog = SettingsDialog(AppConfig(drafter="ngram", max_new_tokens=8), store)
    qtbot.addWidget(dialog)
    dialog.server_radio.setChecked(True)
    dialog.server_url_edit.setText(url)
    dialog.api_key_edit.setText(key)
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(dialog.applied) as applied:
        dialog.apply_button.click()
    return applied.args[0]


def test_the_api_key_is_kept_outside_the_database_and_the_settings(qtbot, store, credentials_dir, tmp_path):
    from engine.remote.credentials import load_api_key

    url = "http://127.0.0.1:9/v1"
    config = choose_server(qtbot, store, url, API_KEY)
    assert config.backend == "server" and config.server_url == url
    assert API_KEY not in json.dumps(store.get_setting(STORE_KEY))
    assert API_KEY.encode() not in (tmp_path / "tandem.db").read_bytes()
    assert load_api_key(url) == API_KEY
    reopened = SettingsDialog(config, store)  # the key is shown again, masked
    qtbot.addWidget(reopened)
    assert reopened.api_key_edit.text() == API_KEY
    assert reopened.api_key_edit.echoMode() == reopened.api_key_edit.EchoMode.Password


def test_the_window_answers_through_a_real_server(qtbot, store, credentials_dir, server_url):
    config = choose_server(qtbot, store, server_url, API_KEY)
    window = MainWindow(store, config)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models_loaded, timeout=TIMEOUT_MS) as loaded:
        window.load_models()
    assert server_url in loaded.args[0].device
    window.message_edit.setPlainText("Say hello.")
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT_MS) as finished:
        window.send()
    assert finished.args[0] == "complete"
    reply = store.thread(window.conversation_id)[-1]
    assert reply.role == "assistant" and reply.content


def test_a_wrong_key_is_a_message_not_a_broken_window(qtbot, store, credentials_dir, server_url):
    config = choose_server(qtbot, store, server_url, "not-the-key")
    window = MainWindow(store, config)
    qtbot.addWidget(window)
    window.load_models()
    qtbot.waitUntil(lambda: window.activity_label.text().startswith("Loading failed"), timeout=TIMEOUT_MS)
    assert window.models_label.text() == "No model loaded"
    text = window.load_error_box.text().lower()
    assert "key" in text or "401" in text
