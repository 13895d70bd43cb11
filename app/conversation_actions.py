"""What can be done to a whole conversation from the menus: its system prompt, export, import.

Export and import use engine/store/export.py, the same code as `tandem-cli export` and
`tandem-cli import`. A .json export dropped onto the window is imported too. File dialogs are
window-modal and non-native, so the window keeps painting and tests can drive them.
"""

from __future__ import annotations

from pathlib import Path

from app.qt import Qt, QtWidgets, Slot
from app.settings_dialog import SystemPromptDialog
from engine.errors import StorageError
from engine.store import export

EXPORT_FORMATS = {"markdown": ("Markdown (*.md)", ".md"), "json": ("Tandem export (*.json)", ".json")}


def dropped_exports(mime) -> list[Path]:
    """The local .json files in a drag's data."""
    if not mime.hasUrls():
        return []
    paths = [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]
    return [path for path in paths if path.suffix.lower() == ".json"]


def _safe_name(title: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in " -_" else " " for c in title).strip()
    return "-".join(cleaned.split())[:60] or "conversation"


class ConversationActions:
    """Bound to one MainWindow; uses its store, sidebar, status bar and storage banner."""

    def __init__(self, window):
        self.window = window
        self.pending_system_prompt: str | None = None  # for a new chat that has no row yet

    @property
    def store(self):
        return self.window.store

    # --- system prompt ---------------------------------------------------------------------------

    @Slot()
    def edit_system_prompt(self, conversation_id: int | None = None) -> SystemPromptDialog:
        window = self.window
        conversation_id = conversation_id if conversation_id is not None else window.conversation_id
        if conversation_id is not None:
            current = self.store.get_conversation(conversation_id).system_prompt or ""
        else:
            current = self.pending_system_prompt or ""
        dialog = SystemPromptDialog(current, window.config.system_prompt, window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._set_system_prompt(conversation_id, dialog.prompt()))
        dialog.open()
        return dialog

    def _set_system_prompt(self, conversation_id: int | None, prompt: str) -> None:
        if conversation_id is None:
            self.pending_system_prompt = prompt
        else:
            self.window.write(
                "save the system prompt",
                lambda: self.store.update_conversation(conversation_id, system_prompt=prompt),
            )
        self.window.refresh_header()
        self.window.statusBar().showMessage(
            "System prompt set for this conversation."
            if prompt
            else "This conversation uses the default system prompt.",
            4000,
        )

    def system_prompt_for_new(self) -> str:
        prompt, self.pending_system_prompt = self.pending_system_prompt, None
        return prompt or self.window.config.system_prompt

    # --- export ----------------------------------------------------------------------------------

    def export(self, kind: str, conversation_ids: list[int] | None) -> QtWidgets.QFileDialog:
        """Ask where to save, then write `kind` (markdown or json) of the conversations (None: all)."""
        name_filter, suffix = EXPORT_FORMATS[kind]
        if conversation_ids and len(conversation_ids) == 1:
            name = _safe_name(self.store.get_conversation(conversation_ids[0]).title)
        else:
            name = "tandem-conversations"
        dialog = self._file_dialog(
            "Export conversations", QtWidgets.QFileDialog.AcceptMode.AcceptSave, name_filter
        )
        dialog.setDefaultSuffix(suffix.lstrip("."))
        dialog.selectFile(str(Path.home() / (name + suffix)))
        dialog.fileSelected.connect(lambda path: self.export_to(kind, conversation_ids, Path(path)))
        dialog.open()
        return dialog

    def export_current(self, kind: str) -> QtWidgets.QFileDialog | None:
        if self.window.conversation_id is None:
            self.window.statusBar().showMessage("Open a conversation to export it.", 4000)
            return None
        return self.export(kind, [self.window.conversation_id])

    def export_to(self, kind: str, conversation_ids: list[int] | None, path: Path) -> bool:
        writer = export.export_markdown if kind == "markdown" else export.export_json
        try:
            writer(self.store, path, conversation_ids)
        except StorageError as exc:
            self._warn("Export failed", str(exc))
            return False
        count = len(conversation_ids) if conversation_ids else len(self.store.list_conversations())
        self.window.statusBar().showMessage(
            f"Exported {count} conversation{'s' * (count != 1)} to {path}", 6000
        )
        return True

    # --- import ----------------------------------------------------------------------------------

    def ask_import(self) -> QtWidgets.QFileDialog:
        dialog = self._file_dialog(
            "Import conversations", QtWidgets.QFileDialog.AcceptMode.AcceptOpen, EXPORT_FORMATS["json"][0]
        )
        dialog.setFileMode(QtWidgets.QFileDialog.FileMode.ExistingFiles)
        dialog.filesSelected.connect(lambda paths: self.import_files([Path(p) for p in paths]))
        dialog.open()
        return dialog

    def import_files(self, paths: list[Path]) -> list[int]:
        """Import Tandem JSON exports; each file all or nothing. Returns the new conversation ids.
        A conversation already here (the same title, start time and messages) is skipped and said so:
        importing one file twice made a same-titled duplicate."""
        imported: list[int] = []
        skipped: list[str] = []
        for path in paths:
            try:
                data, already = self._without_duplicates(_read_export(path))
                skipped += already
                if not already or data["conversations"]:
                    imported += _import(self.store, data, path)
            except StorageError as exc:  # ImportFormatError included: the message names the file
                self._warn("Import failed", str(exc))
        window = self.window
        words = []
        if imported:
            window.sidebar.refresh()
            window.sidebar.select(imported[0])
            count = len(imported)
            words.append(f"Imported {count} conversation{'s' * (count != 1)}.")
        if skipped:
            titles = ", ".join(f"“{title}”" for title in skipped)
            words.append(f"Already here, not imported again: {titles}.")
        if words:
            window.statusBar().showMessage(" ".join(words), 8000)
        return imported

    def _without_duplicates(self, data) -> tuple[dict, list[str]]:
        """The export without the conversations this store already holds, and their titles."""
        if not isinstance(data, dict) or not isinstance(data.get("conversations"), list):
            return data, []  # import_data says what is wrong with it
        held: dict[tuple, set] = {}
        for conversation in self.store.list_conversations():
            held.setdefault((conversation.title, conversation.created), set())
            held[(conversation.title, conversation.created)].add(conversation.id)
        kept, skipped = [], []
        for snapshot in data["conversations"]:
            fingerprint = _fingerprint(snapshot)
            same = held.get(fingerprint[:2], set()) if fingerprint else set()
            if any(_fingerprint(self.store.snapshot(cid)) == fingerprint for cid in same):
                skipped.append(fingerprint[0])
            else:
                kept.append(snapshot)
        return {**data, "conversations": kept}, skipped

    # --- the sidebar's menu ----------------------------------------------------------------------

    def conversation_menu(self, conversation_id: int) -> QtWidgets.QMenu:
        window = self.window
        menu = QtWidgets.QMenu(window)
        menu.addAction("Open", lambda: window.sidebar.select(conversation_id))
        menu.addAction(
            "Rename", lambda: (window.sidebar.select(conversation_id), window.sidebar.start_rename())
        )
        menu.addAction("System prompt…", lambda: self.edit_system_prompt(conversation_id))
        menu.addSeparator()
        menu.addAction("Export as Markdown…", lambda: self.export("markdown", [conversation_id]))
        menu.addAction("Export as JSON…", lambda: self.export("json", [conversation_id]))
        menu.addSeparator()
        menu.addAction("Delete (can be undone)", lambda: window.sidebar.delete(conversation_id))
        return menu

    def show_conversation_menu(self, conversation_id: int, global_position) -> None:
        menu = self.conversation_menu(conversation_id)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.popup(global_position)

    # --- helpers ---------------------------------------------------------------------------------

    def _file_dialog(self, title: str, mode, name_filter: str) -> QtWidgets.QFileDialog:
        dialog = QtWidgets.QFileDialog(self.window, title)
        dialog.setOption(QtWidgets.QFileDialog.Option.DontUseNativeDialog, True)
        dialog.setAcceptMode(mode)
        dialog.setNameFilter(name_filter)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        return dialog

    def _warn(self, title: str, message: str) -> None:
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Warning, title, message, parent=self.window)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()


def _read_export(path: Path):
    """The JSON of an export file (export.import_json's reading, without the import)."""
    import json

    from engine.errors import ImportFormatError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise StorageError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    except (ValueError, RecursionError) as exc:
        raise ImportFormatError(f"{path} is not a Tandem conversation export ({exc}).") from exc


def _import(store, data, path: Path) -> list[int]:
    from engine.errors import ImportFormatError

    try:
        return export.import_data(store, data)
    except ImportFormatError as exc:
        raise ImportFormatError(f"{path}: {exc}") from None


def _fingerprint(snapshot) -> tuple | None:
    """(title, created, the messages' roles and texts in order): what makes two conversations the same."""
    try:
        conversation = snapshot["conversation"]
        messages = tuple((m["role"], m["content"]) for m in snapshot["messages"])
        return (conversation["title"], conversation["created"], messages)
    except (KeyError, TypeError):
        return None
