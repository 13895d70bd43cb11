"""The settings dialog: where replies are computed, models, speculation, sampling, the system prompt.

Nothing is saved until it is valid: the target and draft are checked on the probe thread
(app/bridge.py `Probes`, running engine/models/probes.py), and Apply and OK stay disabled with the
reason shown while a check refuses. Pressed while a check is still running, they say so and take
effect when it answers (or show its refusal). Cancel puts back the config the dialog opened with, even after
Apply. A newer request makes an older answer stale; stale answers are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from app.bridge import Probes
from app.config import DRAFTERS, AppConfig
from app.form_widgets import select, set_choices
from app.qt import QtWidgets, Signal, Slot
from app.settings_pages import DRAFTER_LABELS, SettingsWidgets
from engine.errors import SettingsError, TandemError
from engine.models import probes
from engine.settings import needs_draft_model

CHECKING = "Checking that the draft shares the target's tokenizer…"
CHECKING_TARGET = "Checking the target…"
DRAFT_AFTER_TARGET = "The draft is checked against the target once the target is found."
WAITING = (CHECKING, CHECKING_TARGET)
APPLY_WHEN_CHECKED = "The settings apply as soon as the check is done."
DRAFTER_REASONS = {
    "auto": "Automatic: measures the drafters on this machine while you chat and keeps the fastest.",
    "model": "A draft model proposes tokens; fastest when it agrees often with the target.",
    "ngram": "Proposes text repeated from the conversation; costs almost nothing.",
    "suffix": "Proposes continuations of earlier replies; costs almost nothing.",
    "head": "A one-layer head over the target's own hidden states drafts (train one with tandem-cli train-head).",
    "none": "Plain decoding, one target step per token.",
}


class SettingsDialog(QtWidgets.QDialog):
    """Edit an AppConfig. `applied` carries the validated new config on Apply and on OK (and the
    original one on Cancel after an Apply)."""

    applied = Signal(object)

    def __init__(
        self,
        config: AppConfig,
        store=None,
        parent: QtWidgets.QWidget | None = None,
        probe_runner: Probes | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._store = store
        self._opened_with = config
        self._config = config
        bridge = getattr(parent, "bridge", None)
        self._probes = probe_runner or getattr(bridge, "probes", None)
        self._own_probes = Probes(self) if self._probes is None else None  # a dialog without the app
        self._probes = self._probes or self._own_probes
        self._probes.answered.connect(self._on_probe_done)
        self._tokens: dict[str, int] = {}
        self._probe_inputs: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}  # only touched on the probe thread
        self._verdicts: dict[str, tuple[bool | None, str] | None] = {"draft": None, "target": None}
        self._pending: str | None = None  # "apply" or "ok", pressed while a check was still running

        self.w = SettingsWidgets(probes.builtin_specs())
        for name in vars(self.w):  # the widgets, by their names, on the dialog too
            setattr(self, name, getattr(self.w, name))
        self.error_label = QtWidgets.QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b")
        self.buttons = QtWidgets.QDialogButtonBox(
            QtWidgets.QDialogButtonBox.StandardButton.Ok
            | QtWidgets.QDialogButtonBox.StandardButton.Apply
            | QtWidgets.QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self._ok)
        self.buttons.rejected.connect(self.reject)
        self.apply_button.clicked.connect(self.apply)
        layout = QtWidgets.QVBoxLayout(self)
        self.tabs = self.w.tabs()
        layout.addWidget(self.tabs, 1)
        self.tabs.currentChanged.connect(lambda _index: self._update_buttons())
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        self.resize(640, 560)  # fits a 1366x768 screen with room for the title bar and a panel

        self._show_config(config)
        self._show_kernels(getattr(bridge, "info", None))
        self._connect_inputs()
        self._ask("specs", (), probes.known_specs)
        self._ask("devices", (), probes.devices)
        self._refresh()

    # --- public API ------------------------------------------------------------------------------

    @property
    def apply_button(self) -> QtWidgets.QPushButton:
        return self.buttons.button(QtWidgets.QDialogButtonBox.StandardButton.Apply)

    @property
    def ok_button(self) -> QtWidgets.QPushButton:
        return self.buttons.button(QtWidgets.QDialogButtonBox.StandardButton.Ok)

    def checking(self) -> bool:
        """A check of the target or draft is still running (Apply and OK then wait for it)."""
        return self._refusal(self.config()) in WAITING

    def config(self) -> AppConfig:
        """The config the widgets show now (not necessarily valid)."""
        w = self.w
        return dataclasses.replace(
            self._config,
            backend="server" if w.server_radio.isChecked() else "local",
            server_url=w.server_url_edit.text().strip(),
            target=w.target_picker.spec(),
            target_precision=w.precision_combo.currentData(),
            context=w.context_spin.value(),
            device=w.device_combo.currentData() or "auto",
            dtype=w.dtype_combo.currentData(),
            compiled=w.compiled_combo.currentData(),
            drafter=w.drafter_combo.currentData(),
            draft=w.draft_picker.spec(),
            draft_quantization=w.quantization_combo.currentData(),
            draft_on_cpu=w.draft_on_cpu_box.isChecked(),
            k_mode="adaptive" if w.adaptive_box.isChecked() else "fixed",
            k=w.k_spin.value(),
            max_k=w.max_k_spin.value(),
            p_min=round(w.p_min_spin.value(), 4),
            trees=w.trees_box.isChecked(),
            **w.sampling.read(),
            stop_strings=w.stop_edit.toPlainText(),
            system_prompt=w.system_prompt_edit.toPlainText(),
            auto_titles=w.titles_box.isChecked(),
        )

    def apply(self) -> bool:
        """Validate, save to the store if there is one, and emit `applied`; False if refused, or if a
        check is still running (then it applies when the check answers)."""
        return self._apply_or_wait("apply")

    def _apply_or_wait(self, action: str) -> bool:
        config = self.config()
        refusal = self._refusal(config)
        if refusal in WAITING:
            self._pending = action
            self.error_label.setText(f"{refusal} {APPLY_WHEN_CHECKED}")
            return False
        self._pending = None
        if refusal:
            self.error_label.setText(refusal)
            return False
        if config.backend == "server":
            try:
                _save_api_key(config.server_url, self.w.api_key_edit.text())
            except TandemError as exc:  # a keyring or key file that cannot be written
                self.error_label.setText(str(exc))
                return False
        self._commit(config)
        return True

    def reject(self) -> None:
        """Cancel: what Apply changed goes back to what the dialog opened with."""
        if self._config != self._opened_with:
            self._commit(self._opened_with)
        super().reject()

    def done(self, result: int) -> None:
        if self._own_probes is not None:
            self._own_probes.shutdown(timeout_ms=-1)  # before the dialog and its probe thread go
        super().done(result)

    def _commit(self, config: AppConfig) -> None:
        if self._store is not None:
            config.save(self._store)
        self._config = config
        self.applied.emit(config)

    # --- showing and reading ---------------------------------------------------------------------

    def _show_config(self, config: AppConfig) -> None:
        w = self.w
        (w.server_radio if config.backend == "server" else w.local_radio).setChecked(True)
        w.server_url_edit.setText(config.server_url)
        if config.server_url:
            w.api_key_edit.setText(_load_api_key(config.server_url))
        w.target_picker.set_spec(config.target)
        w.draft_picker.set_spec(config.draft)
        select(w.precision_combo, config.target_precision)
        w.context_spin.setValue(config.context)
        set_choices(w.drafter_combo, {d: DRAFTER_LABELS.get(d, d) for d in DRAFTERS})
        select(w.drafter_combo, config.drafter)
        select(w.quantization_combo, config.draft_quantization)
        if config.device not in (w.device_combo.itemData(i) for i in range(w.device_combo.count())):
            w.device_combo.addItem(config.device, config.device)  # until the device check answers
        select(w.device_combo, config.device)
        select(w.dtype_combo, config.dtype)
        select(w.compiled_combo, config.compiled)
        w.draft_on_cpu_box.setChecked(config.draft_on_cpu)
        w.adaptive_box.setChecked(config.k_mode == "adaptive")
        w.k_spin.setValue(config.k)
        w.max_k_spin.setValue(config.max_k)
        w.p_min_spin.setValue(config.p_min)
        w.trees_box.setChecked(config.trees)
        w.sampling.fill(config)
        w.stop_edit.setPlainText(config.stop_strings)
        w.system_prompt_edit.setPlainText(config.system_prompt)
        w.titles_box.setChecked(config.auto_titles)

    def _show_kernels(self, info) -> None:
        """The quantized kernels of the loaded models and why each was chosen (engine.models.quantize)."""
        kernels = getattr(info, "kernels", ())
        if info is None:
            text = "Shown once the models have loaded."
        else:
            text = "\n".join(kernels) or "No quantized model is loaded: plain floating-point kernels."
        self.w.kernel_note.setText(text)

    def _connect_inputs(self) -> None:
        w = self.w
        for signal in (
            w.precision_combo.currentIndexChanged,
            w.context_spin.valueChanged,
            w.target_picker.changed,
            w.draft_picker.changed,
            w.drafter_combo.currentIndexChanged,
            w.quantization_combo.currentIndexChanged,
            w.device_combo.currentIndexChanged,
            w.dtype_combo.currentIndexChanged,
            w.compiled_combo.currentIndexChanged,
            w.draft_on_cpu_box.toggled,
            w.adaptive_box.toggled,
            w.trees_box.toggled,
            w.server_radio.toggled,
            w.server_url_edit.textChanged,
            w.stop_edit.textChanged,
            w.k_spin.valueChanged,
            w.max_k_spin.valueChanged,
            w.p_min_spin.valueChanged,
            w.sampling.changed,
        ):
            signal.connect(self._refresh)

    # --- state -----------------------------------------------------------------------------------

    def _refresh(self, *_args) -> None:
        w, config = self.w, self.config()
        local = config.backend == "local"
        drafting = local and needs_draft_model(config.drafter)
        for widget in (w.server_url_edit, w.api_key_edit):
            widget.setEnabled(not local)
        local_only = (
            w.target_picker,
            w.precision_combo,
            w.context_spin,
            w.drafter_combo,
            w.device_combo,
            w.dtype_combo,
        )
        for widget in (*local_only, w.compiled_combo):
            widget.setEnabled(local)
        for widget in (w.draft_picker, w.quantization_combo, w.draft_on_cpu_box):
            widget.setEnabled(drafting)
        w.k_spin.setEnabled(config.k_mode == "fixed")
        w.max_k_spin.setEnabled(config.k_mode == "adaptive")
        w.drafter_reason.setText(DRAFTER_REASONS.get(config.drafter, "") if local else "")
        target, draft = config.target, config.draft
        self._ask("target", target if local and target.strip() else None, lambda: probes.check_target(target))
        cache, listed = self._tokenizers, [s for s in w.draft_picker.specs() if s != draft]

        def check_drafts():
            try:
                probes.check_target(target)
            except TandemError:  # the target's own row says why; the draft cannot be compared yet
                return (None, DRAFT_AFTER_TARGET), {}
            verdict = probes.check_draft(target, draft, cache)
            return verdict, {spec: probes.check_draft(target, spec, cache) for spec in listed}

        self._ask("draft", (target, draft, tuple(listed)) if drafting else None, check_drafts)
        precision = config.target_precision
        memory = dict(
            device=config.device,
            draft_on_cpu=config.draft_on_cpu,
            dtype={"fp32": "float32", "bf16": "bfloat16"}.get(precision, config.dtype),
            target_quantization=precision if precision in ("int8", "int4") else "none",
            draft_quantization=config.draft_quantization,
            target_precision=precision,
            context=config.context,
        )
        self._ask(
            "memory",
            (target, draft if drafting else None, tuple(memory.items())) if local else None,
            lambda: probes.memory_line(target, draft if drafting else None, **memory),
        )
        self._ask(
            "precision",
            (precision, config.device) if local and precision != "default" else None,
            lambda: probes.precision_line(precision, config.device),
        )
        device = "cpu" if config.draft_on_cpu else config.device
        quantization = config.draft_quantization
        self._ask(
            "quantization",
            (quantization, device) if drafting else None,
            lambda: probes.quantization_line(quantization, device),
        )
        self._update_buttons()

    def _ask(self, kind: str, inputs: Any, work: Callable[[], Any]) -> None:
        """Run work() on the probe thread unless its inputs are unchanged; inputs None clears it."""
        if kind in self._probe_inputs and self._probe_inputs[kind] == inputs:
            return
        self._probe_inputs[kind] = inputs
        if kind in self._verdicts:
            self._verdicts[kind] = None if inputs is not None else (True, "")
            label = self.w.draft_reason if kind == "draft" else self.w.target_reason
            label.setText({"draft": CHECKING, "target": CHECKING_TARGET}[kind] if inputs is not None else "")
        if inputs is None:
            self._tokens[kind] = self._tokens.get(kind, 0) + 1
            w = self.w
            notes = {
                "memory": w.memory_label,
                "quantization": w.quantization_note,
                "precision": w.precision_note,
            }
            if kind in notes:
                notes[kind].setText("")
            return
        self._tokens[kind] = self._probes.submit(f"{id(self)}:{kind}", work)

    @Slot(str, int, object, object)
    def _on_probe_done(self, key: str, token: int, result: Any, error: BaseException | None) -> None:
        owner, _, kind = key.partition(":")
        if owner != str(id(self)) or token != self._tokens.get(kind):
            return
        w = self.w
        if kind == "draft":
            self._show_draft_verdict(result, error)
        elif kind == "target":
            ok = None if error is not None and not isinstance(error, TandemError) else error is None
            self._verdicts["target"] = (ok, str(error) if error is not None else "")
            w.target_reason.setText(str(error) if error is not None else (result or ""))
            w.target_reason.setStyleSheet("color: #c0392b" if ok is False else "")
        elif kind == "memory":
            w.memory_label.setText(f"Could not estimate: {error}" if error else result)
        elif kind == "quantization":
            w.quantization_note.setText(f"{error}" if error else result)
        elif kind == "precision":
            w.precision_note.setText(f"{error}" if error else result)
        elif kind == "specs" and error is None:
            w.target_picker.add_specs(result)
            w.draft_picker.add_specs(result)
            self._refresh()
        elif kind == "devices" and error is None:
            offered, note = result
            set_choices(w.device_combo, {d: d for d in offered})
            select(w.device_combo, self._config.device if self._config.device in offered else "auto")
            w.device_note.setText(note)
        self._update_buttons()

    def _show_draft_verdict(self, result, error: BaseException | None) -> None:
        if isinstance(error, TandemError):  # a missing path, a pickle checkpoint, remote code: refused
            verdict = (False, str(error))
        elif error is not None:
            verdict = (None, f"Could not compare tokenizers: {error}")
        else:
            verdict, listed = result
            for spec, (ok, reason) in listed.items():
                self.w.draft_picker.mark(spec, ok, reason)
        self._verdicts["draft"] = verdict
        ok, reason = verdict
        self.w.draft_reason.setText(reason if ok is not True else "")
        self.w.draft_reason.setStyleSheet("color: #c0392b" if ok is False else "")

    def _refusal(self, config: AppConfig) -> str:
        """Why config cannot be applied now, or ''."""
        try:
            config.validate()
        except SettingsError as exc:
            return str(exc)
        if config.backend == "server":
            return ""
        for kind, waiting in (("target", CHECKING_TARGET), ("draft", CHECKING)):
            if kind == "draft" and not needs_draft_model(config.drafter):
                continue
            verdict = self._verdicts[kind]
            if verdict is None:
                return waiting
            if verdict[0] is False:
                return verdict[1]
        return ""

    def _update_buttons(self) -> None:
        refusal = self._refusal(self.config())
        if self._pending is not None and refusal in WAITING:
            self.error_label.setText(f"{refusal} {APPLY_WHEN_CHECKED}")
        else:
            # a verdict already has its own label beside its model, when that is on the page in view
            page = self.tabs.currentWidget()
            labels = (self.w.draft_reason, self.w.target_reason)
            beside = [label.text() for label in labels if page.isAncestorOf(label)]
            self.error_label.setText("" if refusal in (*WAITING, *beside) else refusal)
        for button in (self.apply_button, self.ok_button):
            button.setEnabled(not refusal or refusal in WAITING)  # pressed while checking: waits
        if self._pending is not None and refusal not in WAITING:
            action, self._pending = self._pending, None
            if self._apply_or_wait(action) and action == "ok":
                self.accept()

    def _ok(self) -> None:
        if self._apply_or_wait("ok"):
            self.accept()


def _save_api_key(base_url: str, key: str) -> None:
    """Into the credentials store (keyring or a 0600 file), never the settings or the database."""
    from engine.remote import credentials

    if key:
        credentials.save_api_key(base_url, key)
    else:
        credentials.delete_api_key(base_url)


def _load_api_key(base_url: str) -> str:
    from engine.remote import credentials

    try:
        return credentials.load_api_key(base_url) or ""
    except TandemError:
        return ""


class SystemPromptDialog(QtWidgets.QDialog):
    """Edit one conversation's system prompt; an empty prompt means the default one."""

    def __init__(self, prompt: str, default_prompt: str, parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("System prompt")
        self._default = default_prompt
        self.edit = QtWidgets.QPlainTextEdit(prompt)
        self.edit.setPlaceholderText(default_prompt)
        reset = QtWidgets.QPushButton("Use default")
        reset.clicked.connect(self.edit.clear)
        buttons = QtWidgets.QDialogButtonBox(
            QtWidgets.QDialogButtonBox.StandardButton.Ok | QtWidgets.QDialogButtonBox.StandardButton.Cancel
        )
        buttons.addButton(reset, QtWidgets.QDialogButtonBox.ButtonRole.ResetRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(QtWidgets.QLabel("System prompt for this conversation (empty: the default):"))
        layout.addWidget(self.edit)
        layout.addWidget(buttons)

    def prompt(self) -> str:
        return self.edit.toPlainText().strip()

    def effective_prompt(self) -> str:
        return self.prompt() or self._default
