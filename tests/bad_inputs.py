"""The bad-input catalogue: every input a user can get wrong, and what Tandem must say about it.

Each Case names the command line (after `tandem-cli`), optional standard input, and a pattern the one
error line must match. `Workspace` builds the files the cases point at (models that are not models,
databases that are not databases) once per test session. test_bad_inputs.py runs every case against
the installed `tandem-cli`; another front end (the HTTP server) can run the same list through itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "tandem-cli"
TINY_CONTEXT = 64  # the tiny model's context: shorter than the engine's calibration prompt
OTHER_USER = 65534  # nobody: who runs a case as a user other than root


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple  # after `tandem-cli`; {ws.<attr>} fields are filled from the Workspace; bytes pass as is
    error: str  # a regular expression the error line must match (case-insensitive)
    stdin: bytes | None = None
    db: str | None = None  # the Workspace attribute of a database that must be left unchanged
    # "read-only" or "full-disk": run inside a mount namespace that makes it so; "another-user": run as
    # a user other than root (root may write anywhere), so that a folder's chmod 555 holds
    wrap: str | None = None
    wrap_folder: str | None = None  # the Workspace attribute of the folder wrapped (default: db's folder)
    loads_model: bool = False  # informational: whether the case gets as far as loading a model
    env: dict = field(default_factory=dict)  # values are filled from the Workspace too
    exit_code: int = 2  # 0 where the command refuses the input and goes on (an interactive chat)


CHAT = ("chat", "--max-new-tokens", "4")
TINY = ("--target", "{ws.tiny}", "--draft", "none")

CASES: list[Case] = [
    # models
    Case("missing path", (*CHAT, "--target", "{ws.root}/no/such/model", "--message", "hi"), r"no model at"),
    Case("empty folder", (*CHAT, "--target", "{ws.empty}", "--message", "hi"), r"config|model"),
    Case("config only", (*CHAT, "--target", "{ws.config_only}", "--message", "hi"), r"weights|safetensors"),
    Case(
        "truncated safetensors",
        (*CHAT, *TINY[:2], "--target", "{ws.truncated}", "--message", "hi"),
        r"truncat|corrupt|damaged|incomplete|safetensors",
    ),
    Case(
        "model folder without a tokenizer",
        (*CHAT, *TINY[2:], "--target", "{ws.no_tokenizer}", "--message", "hi"),
        r"has no tokenizer \(tokenizer.json or tokenizer.model\): copy the tokenizer files",
    ),
    Case("random-bytes gguf", (*CHAT, "--target", "{ws.random_gguf}", "--message", "hi"), r"not a gguf"),
    Case("pickle checkpoint", (*CHAT, "--target", "{ws.pickle}", "--message", "hi"), r"pickle"),
    Case(
        "offline hub id",
        (*CHAT, "--target", "tandem-test-org/no-such-model", "--message", "hi"),
        r"offline|reach|hub|download",
    ),
    Case(
        "incompatible draft",
        (*CHAT, "--draft", "{ws.incompatible}", "--quant", "none", "--message", "hi"),
        r"tokenizer|vocabular|incompatible",
        loads_model=True,
    ),
    Case("device tpu", (*CHAT, "--device", "tpu", "--message", "hi"), r"unknown device 'tpu'"),
    Case("device cuda without cuda", (*CHAT, "--device", "cuda", "--message", "hi"), r"cuda gpu"),
    # settings
    Case("k 0", (*CHAT, "--k", "0", "--message", "hi"), r"k must be between 1 and 16"),
    Case("k 1000", (*CHAT, "--k", "1000", "--message", "hi"), r"k must be between 1 and 16"),
    Case("k -3", (*CHAT, "--k=-3", "--message", "hi"), r"k must be between 1 and 16"),
    Case("k abc", (*CHAT, "--k", "abc", "--message", "hi"), r"--k must be 'adaptive' or an integer"),
    Case(
        "temperature -1",
        (*CHAT, "--temperature=-1", "--message", "hi"),
        r"temperature must be between 0 and 5",
    ),
    Case(
        "temperature nan",
        (*CHAT, "--temperature", "nan", "--message", "hi"),
        r"temperature must be between 0 and 5, not nan",
    ),
    Case("top-p 0", (*CHAT, "--top-p", "0", "--message", "hi"), r"top-p must be in"),
    Case("top-p nan", (*CHAT, "--top-p", "nan", "--message", "hi"), r"top-p must be in"),
    Case(
        "seed 2**70",
        (*CHAT, "--seed", str(2**70), "--message", "hi"),
        r"seed must be a whole number from -9223372036854775808 to 9223372036854775807 .*, not 1180591620717411303424",
    ),
    Case(
        "seed -2**63 - 1",
        (*CHAT, "--seed", str(-(2**63) - 1), "--message", "hi"),
        r"seed must be a whole number from",
    ),
    Case(
        "max-new-tokens 0",
        ("chat", "--max-new-tokens", "0", "--message", "hi"),
        r"max new tokens must be at least 1",
    ),
    # messages
    Case(
        "empty message", (*CHAT, "--message", "", "--db", "{ws.good_db}"), r"--message is empty", db="good_db"
    ),
    Case(
        "message past the context",
        (*CHAT, *TINY, "--message", "word " * 200, "--db", "{ws.good_db}"),
        r"tokens long, but .* reads at most 64",
        db="good_db",
        loads_model=True,
    ),
    Case(
        "interactive message past the context",
        (*CHAT, *TINY, "--db", "{ws.good_db}"),
        r"tokens long, but .* reads at most 64 .*send a shorter message, or /new to start a new conversation",
        stdin=("word " * 200 + "\nhello\n").encode(),
        loads_model=True,
        exit_code=0,
    ),
    Case(
        "invalid utf-8 message",
        (*CHAT, "--message", b"caf\xe9 \xff", "--db", "{ws.good_db}"),
        r"--message is not valid utf-8",
        db="good_db",
    ),
    Case(
        "invalid utf-8 on stdin",
        (*CHAT, *TINY, "--db", "{ws.good_db}"),
        r"not valid utf-8",
        stdin=b"caf\xe9 \xff\n",
        db="good_db",
        loads_model=True,
    ),
    Case(
        "nul byte on stdin",
        (*CHAT, *TINY, "--db", "{ws.good_db}"),
        r"nul character",
        stdin=b"hello\x00world\n",
        db="good_db",
        loads_model=True,
    ),
    # databases
    Case("db is a folder", (*CHAT, "--message", "hi", "--db", "{ws.root}"), r"is a folder"),
    Case(
        "db random bytes",
        (*CHAT, "--message", "hi", "--db", "{ws.random_db}"),
        r"damaged or is not a tandem database",
        db="random_db",
    ),
    Case("db damaged", (*CHAT, "--message", "hi", "--db", "{ws.damaged_db}"), r"is damaged", db="damaged_db"),
    Case(
        "db too new",
        (*CHAT, "--message", "hi", "--db", "{ws.future_db}"),
        r"newer version of tandem",
        db="future_db",
    ),
    Case(
        "db read-only",
        (*CHAT, "--message", "hi", "--db", "{ws.good_db}"),
        r"cannot be (opened|written)",
        db="good_db",
        wrap="read-only",
    ),
    Case(
        "db on a full disk",
        (*CHAT, "--message", "hi", "--db", "{ws.good_db}"),
        r"is full: free space and retry",
        db="good_db",
        wrap="full-disk",
    ),
    Case(
        "db in use by another tandem",
        (*CHAT, "--message", "hi", "--db", "{ws.held_db}"),
        r"in use by another tandem",
        db="held_db",
    ),
    # the cache folder
    Case(
        "cache folder read-only",
        (*CHAT, "--message", "hi"),
        r"cannot write to its (model )?cache folder .*ro-cache.* \(a read-only disk\)\. set TANDEM_CACHE_DIR",
        env={"TANDEM_CACHE_DIR": "{ws.ro_cache}"},
        wrap="read-only",
        wrap_folder="ro_cache",
    ),
    Case(
        "cache folder chmod 555",
        (*CHAT, "--message", "hi"),
        r"cannot write to its (model )?cache folder .*tandem-unwritable-.* \(permission denied\)\. set TANDEM_CACHE_DIR",
        env={"TANDEM_CACHE_DIR": "{ws.unwritable}", "HOME": "{ws.unwritable}"},
        wrap="another-user",
    ),
    Case(
        "cache folder under a file",
        (*CHAT, "--message", "hi"),
        r"cannot write to its cache folder .*random.gguf/cache \(not a directory\)\. set TANDEM_CACHE_DIR",
        env={"TANDEM_CACHE_DIR": "{ws.random_gguf}/cache"},
    ),
    # import
    Case(
        "import of an export without its conversation",
        ("import", "--db", "{ws.good_db}", "{ws.export_without_conversation}"),
        r"export-without-conversation.json: conversation 1 of 1 is damaged\. its entry has no 'conversation'\.",
        db="good_db",
    ),
    Case(
        "import of an export whose message lacks a role",
        ("import", "--db", "{ws.good_db}", "{ws.export_without_role}"),
        r"conversation 2 of 2 is damaged\. message 4 has no 'role'\.",
        db="good_db",
    ),
    Case(
        "import of a file that is not an export",
        ("import", "--db", "{ws.good_db}", "{ws.random_db}"),
        r"random.db is not a tandem conversation export",
        db="good_db",
    ),
    # benchmark
    Case(
        "bench json unwritable",
        ("bench", "--limit", "1", "--json", "{ws.good_db}/r.json"),
        r"--json .* cannot be written",
    ),
    Case(
        "bench head vocabulary of zero",
        ("bench", "--limit", "1", "--draft", "head", "--head-vocab", "0"),
        r"--head-vocab must be 1 or more",
    ),
    Case(
        "bench repeat of zero",
        ("bench", "--limit", "1", "--repeat", "0"),
        r"--repeat must be 1 or more",
    ),
    Case(
        "bench synthetic pair unknown",
        ("bench", "--synthetic", "qwen2.5-7b:llama-70b"),
        r"--synthetic takes TARGET:DRAFT from qwen2.5-7b",
    ),
]


class Workspace:
    """The files the cases point at, built once: models that are not models, databases that are not."""

    def __init__(self, root: Path, tokenizer):
        self.root = root
        self.empty = root / "empty"
        self.empty.mkdir()
        self.tiny = self._tiny_model(root / "tiny", tokenizer, TINY_CONTEXT)
        self.config_only = root / "config-only"
        self.config_only.mkdir()
        shutil.copy(self.tiny / "config.json", self.config_only / "config.json")
        self.truncated = root / "truncated"
        shutil.copytree(self.tiny, self.truncated)
        weights = self.truncated / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        self.no_tokenizer = root / "no-tokenizer"
        shutil.copytree(self.tiny, self.no_tokenizer)
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
        ):
            (self.no_tokenizer / name).unlink(missing_ok=True)
        self.random_gguf = root / "random.gguf"
        self.random_gguf.write_bytes(os.urandom(4096))
        self.ro_cache = root / "ro-cache"
        self.ro_cache.mkdir()
        # outside the test's own folder, which only root may enter; close() removes it
        self.unwritable = Path(tempfile.mkdtemp(prefix="tandem-unwritable-"))
        self.unwritable.chmod(0o555)
        self.export_without_conversation = root / "export-without-conversation.json"
        self.export_without_conversation.write_text(
            json.dumps({"format": "tandem-conversations", "version": 1, "conversations": [{"messages": []}]})
        )
        self.export_without_role = root / "export-without-role.json"
        self.export_without_role.write_text(json.dumps(_export_without_a_role()))
        self.pickle = root / "pickle"
        self.pickle.mkdir()
        shutil.copy(self.tiny / "config.json", self.pickle / "config.json")
        (self.pickle / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle of the number 1
        self.incompatible = self._incompatible_model(root / "incompatible", tokenizer)
        self.random_db = root / "random.db"
        self.random_db.write_bytes(os.urandom(8192))
        self.damaged_db = root / "damaged.db"
        self.future_db = root / "future.db"
        self.good_db = root / "good.db"
        self.held_db = root / "held.db"

    def close(self) -> None:
        self.unwritable.chmod(0o755)
        shutil.rmtree(self.unwritable)

    def fresh_databases(self) -> None:
        """Databases for one case: a good one with a conversation, a damaged one and a too-new one."""
        sys.path.insert(0, str(ROOT))
        from engine.store.database import SCHEMA_VERSION, Store

        for path in (self.good_db, self.held_db, self.damaged_db, self.future_db):
            for side in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                side.unlink(missing_ok=True)
            with Store(path) as store:
                cid = store.create_conversation("kept", "builtin", {}, "")
                store.add_message(cid, "user", "a message that must stay " * 200)
                store.add_message(cid, "assistant", "an answer that must stay")
        data = bytearray(self.damaged_db.read_bytes())
        for start in range(2 * 4096, len(data), 2 * 4096):
            data[start : start + 4096] = os.urandom(4096)
        self.damaged_db.write_bytes(bytes(data))
        conn = sqlite3.connect(self.future_db, isolation_level=None)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.close()

    @staticmethod
    def _tiny_model(folder: Path, tokenizer, context: int) -> Path:
        from conftest import build_tiny_llama

        model = build_tiny_llama(tokenizer, seed=3)
        model.config.max_position_embeddings = context
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        return folder

    @classmethod
    def _incompatible_model(cls, folder: Path, tokenizer) -> Path:
        """A tiny model whose tokenizer gives two ordinary tokens each other's ids."""
        import json

        cls._tiny_model(folder, tokenizer, 1024)
        path = folder / "tokenizer.json"
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]
        a, b = "hello", "world"
        vocab[a], vocab[b] = vocab[b], vocab[a]
        path.write_text(json.dumps(data))
        return folder


def _export_without_a_role() -> dict:
    """An export of two conversations; the second's reply has lost its role."""
    conversation = {
        "id": 1,
        "title": "t",
        "created": "2024-05-01T12:00:00.000000Z",
        "updated": "2024-05-01T12:00:00.000000Z",
        "target_model": "builtin",
        "system_prompt": "",
        "draft_settings": {},
    }
    message = {
        "id": 1,
        "parent_id": None,
        "role": "user",
        "content": "hi",
        "created": conversation["created"],
        "status": "complete",
        "token_count": None,
        "stats": None,
        "selected": 1,
    }
    reply = {**message, "id": 4, "parent_id": 3}
    del reply["role"]
    return {
        "format": "tandem-conversations",
        "version": 1,
        "conversations": [
            {"conversation": conversation, "messages": [message]},
            {"conversation": {**conversation, "id": 2}, "messages": [{**message, "id": 3}, reply]},
        ],
    }


def fill(value, ws: Workspace):
    return value if isinstance(value, bytes) else value.format(ws=ws)


def fingerprint(path: Path):
    """What a database holds: its rows when SQLite can read it, else its bytes; None when absent.

    The full-text index's own rows are left out: they are derived from the messages, and a message
    stored and then taken back (a --message the model refused) leaves the same rows but another index."""
    if not path.exists():
        return None
    if path.is_dir():
        return sorted(p.name for p in path.iterdir())
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [line for line in conn.iterdump() if not line.startswith('INSERT INTO "messages_fts_')]
            return [conn.execute("PRAGMA user_version").fetchone()[0], *rows]
        finally:
            conn.close()
    except sqlite3.Error:
        return path.read_bytes()


def wrapped(command: list, case: Case, ws: Workspace) -> list:
    """The command inside a private mount namespace that makes the case's folder (the database's by
    default) read-only or full."""
    if case.wrap is None:
        return command
    if case.wrap == "another-user":
        if os.geteuid() != 0:
            return command
        return ["setpriv", f"--reuid={OTHER_USER}", f"--regid={OTHER_USER}", "--clear-groups", *command]
    folder = str(getattr(ws, case.wrap_folder) if case.wrap_folder else getattr(ws, case.db).parent)
    if case.wrap == "read-only":
        setup = f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}"'
    else:  # a 2 MiB disk holding the database, then filled up
        setup = (
            f'mkdir -p "{folder}/.full" && mount -t tmpfs -o size=2m tandem-full "{folder}/.full" && '
            f'cp "{ws.good_db}" "{folder}/.full/" && mount --bind "{folder}/.full" "{folder}" && '
            f'(dd if=/dev/zero of="{folder}/filler" bs=64k 2>/dev/null || true)'
        )
    return ["unshare", "-rm", "sh", "-c", f'{setup} && exec "$0" "$@"', *command]


def can_wrap(case: Case) -> bool:
    if case.wrap == "another-user":
        return os.geteuid() != 0 or shutil.which("setpriv") is not None
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_case(case: Case, ws: Workspace, timeout: float = 600) -> subprocess.CompletedProcess:
    command = wrapped([str(CLI), *(fill(a, ws) for a in case.args)], case, ws)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TANDEM_DATA_DIR": str(ws.root / "data"),
        **{name: fill(value, ws) for name, value in case.env.items()},
    }
    return subprocess.run(
        command, input=case.stdin or b"", capture_output=True, env=env, timeout=timeout, cwd=ws.root
    )
