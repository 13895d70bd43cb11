"""The settings dialog: models, speculation, sampling and the default system prompt.

Anything that may take more than a moment (reading tokenizers for the compatibility check, the
memory estimate, probing INT4 support) runs on a background thread and reports back with a signal;
a newer request makes an older answer stale, and stale answers are dropped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.config import COMPILED, DEVICES, DTYPES, QUANTIZATIONS, AppConfig
from app.qt import Qt, QtWidgets, Signal
from engine.errors import SettingsError, TandemError
from engine.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX, converted_dir, is_converted
from engine.settings import MAX_K

HUB_NOTE = "A hub id (owner/name) is downloaded when the models load; the status bar shows its progress."
CHECKING = "Checking that the draft shares the target's tokenizer…"


# --- model probes: plain functions, run on the background thread ---------------------------------


def local_folder(spec: str) -> Path | None:
    """The folder holding a model's files if it is on disk already; never converts or downloads."""
    from engine.models.loading import gguf_cache_folder, spec_kind

    kind = spec_kind(spec)  # raises, with a message for the user, for a path that does not exist
    if kind == "builtin":
        folder = converted_dir(spec.removeprefix(BUILTIN_PREFIX))
        return folder if is_converted(folder) else None
    path = Path(spec).expanduser()
    if kind == "folder":
        return path
    if kind == "gguf":
        folder = gguf_cache_folder(path)
        return folder if is_converted(folder) else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(spec, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def load_tokenizer(spec: str):
    """The model's tokenizer alone, or None when it is not on disk (a hub id not yet downloaded)."""
    from engine.models import loading

    folder = local_folder(spec)
    if folder is not None:
        return loading.load_tokenizer(folder)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    return None


def load_model_config(spec: str):
    from engine.models import loading

    if Path(spec).expanduser().suffix.lower() == ".gguf":
        return loading.load_config(spec)
    folder = local_folder(spec)
    return None if folder is None else loading.load_config(str(folder))


def catalog_family(spec: str) -> str | None:
    """The tokenizer family the catalogue gives a model, for models whose tokenizer is not on disk."""
    try:
        from engine.models import catalog
    except ImportError:
        return None
    family_of = getattr(catalog, "family_of", None)
    return family_of(spec) if callable(family_of) else None


def check_draft(target: str, draft: str, tokenizers: dict[str, Any]) -> tuple[bool | None, str]:
    """(ok, reason); ok is None when neither the tokenizers nor the catalogue can tell yet."""
    for spec in (target, draft):
        if spec not in tokenizers:
            tokenizers[spec] = load_tokenizer(spec)
    target_tokenizer, draft_tokenizer = tokenizers[target], tokenizers[draft]
    if target_tokenizer is not None and draft_tokenizer is not None:
        from engine.models.compat import compatibility

        return compatibility(target_tokenizer, draft_tokenizer)
    target_family, draft_family = catalog_family(target), catalog_family(draft)
    if target_family and draft_family:
        if target_family == draft_family:
            return True, f"Same tokenizer family ({draft_family}); checked again when loading."
        return (
            False,
            f"The draft's tokenizer family ({draft_family}) differs from the target's ({target_family}).",
        )
    return None, "Not on disk yet: the tokenizers are compared after the download."


def estimate_memory_line(config: AppConfig) -> str:
    from engine.models.memory import estimate_memory

    target_config = load_model_config(config.target)
    if target_config is None:
        return "Memory estimate available once the target is downloaded."
    draft_config = None
    if config.drafter == "model":
        draft_config = load_model_config(config.draft)
        if draft_config is None:
            return "Memory estimate available once the draft is downloaded."
    estimate = estimate_memory(
        target_config,
        draft_config,
        device=config.device,
        draft_device="cpu" if config.draft_on_cpu else None,
        target_dtype=config.dtype,
        draft_dtype=config.dtype,
        draft_quantization=config.draft_quantization,
    )
    return estimate.summary


def quantization_line(config: AppConfig) -> str:
    from engine.models.quantize import quantization_note

    if config.drafter != "model":
        return ""
    device = "cpu" if config.draft_on_cpu else config.device
    if device == "auto":
        from engine.models.loaded import resolve_device

        device = resolve_device("auto").type
    return quantization_note(config.draft_quantization, device)


def builtin_specs() -> list[str]:
    return [BUILTIN_PREFIX + name for name in BUILTIN_MODELS]


def catalog_specs() -> list[str]:
    """Model specs the catalogue suggests, built-in ones first, without duplicates."""
    specs = builtin_specs()
    try:
        from engine.models import catalog
    except ImportError:
        return specs
    list_models = getattr(catalog, "list_models", None)
    if callable(list_models):
        for entry in list_models():
            spec = getattr(entry, "spec", entry)
            if isinstance(spec, str) and spec not in specs:
                specs.append(spec)
    return specs


# --- widgets ---------------------------------------------------------------------------------------


class ModelPicker(QtWidgets.QWidget):
    """An editable list of model specs with buttons to pick a local folder or a GGUF file."""

    changed = Signal()

    def __init__(self, specs: list[str], parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.combo = QtWidgets.QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QtWidgets.QComboBox.InsertPolicy.NoInsert)
        self.combo.setSizeAdjustPolicy(
            QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.combo.setMinimumContentsLength(28)
        for spec in specs:
            self.combo.addItem(spec, spec)
        folder_button = QtWidgets.QPushButton("Folder…")
        gguf_button = QtWidgets.QPushButton("GGUF…")
        folder_button.clicked.connect(self._pick_folder)
        gguf_button.clicked.connect(self._pick_gguf)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 1)
        layout.addWidget(folder_button)
        layout.addWidget(gguf_button)
        self.combo.currentTextChanged.connect(lambda _text: self.changed.emit())

    def spec(self) -> str:
        return self.combo.currentText().strip()

    def set_spec(self, spec: str) -> None:
        if spec and self.combo.findData(spec) < 0:
            self.combo.addItem(spec, spec)
        index = self.combo.findData(spec)
        if index >= 0:
            self.combo.setCurrentIndex(index)
        else:
            self.combo.setCurrentText(spec)

    def mark(self, spec: str, ok: bool | None, reason: str) -> None:
        """Show a listed model's compatibility: incompatible ones cannot be chosen, and say why."""
        index = self.combo.findData(spec)
        # Touching the current item would make an edited combo put back that item's text.
        if index < 0 or index == self.combo.currentIndex():
            return
        item = self.combo.model().item(index)
        item.setEnabled(ok is not False)
        item.setToolTip(reason if ok is not False else f"Incompatible: {reason}")

    def _pick_folder(self) -> None:
        folder = QtWidgets.QFileDialog.getExistingDirectory(self, "Choose a model folder")
        if folder:
            self.set_spec(folder)

    def _pick_gguf(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Choose a GGUF file", "", "GGUF files (*.gguf)")
        if path:
            self.set_spec(path)


class SettingsDialog(QtWidgets.QDialog):
    """Edit an AppConfig. `applied` carries the validated new config on Apply and on OK."""

    applied = Signal(object)
    _probe_done = Signal(str, int, object, object)  # kind, token, result, error

    def __init__(self, config: AppConfig, store=None, parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._store = store
        self._config = config
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="settings-probe"
        )
        self._tokens: dict[str, int] = {}
        self._tokenizers: dict[str, Any] = {}  # only touched on the probe thread
        self._probe_inputs: dict[str, Any] = {}
        self._draft_verdict: tuple[bool | None, str] | None = None
        self._probe_done.connect(self._on_probe_done)

        specs = catalog_specs()
        self.target_picker = ModelPicker(specs)
        self.draft_picker = ModelPicker(specs)
        self.drafter_combo = _choices({"model": "Draft model", "ngram": "N-gram lookup", "none": "None"})
        self.quantization_combo = _choices({q: q.upper() if q != "none" else "None" for q in QUANTIZATIONS})
        self.draft_on_cpu_box = QtWidgets.QCheckBox("Run the draft on the CPU")
        self.device_combo = _choices({d: d for d in DEVICES})
        self.dtype_combo = _choices({d: d for d in DTYPES})
        self.compiled_combo = _choices({c: c for c in COMPILED})
        self.quantization_note = _note_label()
        self.draft_reason = _note_label()
        self.memory_label = _note_label()

        self.adaptive_box = QtWidgets.QCheckBox("Adaptive K")
        self.k_spin = _spin(1, MAX_K)
        self.max_k_spin = _spin(1, MAX_K)
        self.p_min_spin = _double_spin(0.0, 0.99, 0.05)

        self.temperature_spin = _double_spin(0.0, 5.0, 0.1)
        self.top_p_spin = _double_spin(0.01, 1.0, 0.05)
        self.top_k_spin = _spin(0, 100_000)
        self.top_k_spin.setSpecialValueText("off")
        self.max_new_tokens_spin = _spin(1, 1_000_000)
        self.seed_spin = _spin(-1, 2**31 - 1)
        self.seed_spin.setSpecialValueText("random")
        self.system_prompt_edit = QtWidgets.QPlainTextEdit()
        self.system_prompt_edit.setMaximumHeight(90)

        self.error_label = _note_label()
        self.error_label.setStyleSheet("color: #c0392b")
        self.draft_reason.setObjectName("draftReason")
        self.buttons = QtWidgets.QDialogButtonBox(
            QtWidgets.QDialogButtonBox.StandardButton.Ok
            | QtWidgets.QDialogButtonBox.StandardButton.Apply
            | QtWidgets.QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self._ok)
        self.buttons.rejected.connect(self.reject)
        self.apply_button.clicked.connect(self.apply)

        self._lay_out()
        self._show_config(config)
        for picker in (self.target_picker, self.draft_picker):
            picker.changed.connect(self._refresh)
        for combo in (
            self.drafter_combo,
            self.quantization_combo,
            self.device_combo,
            self.dtype_combo,
            self.compiled_combo,
        ):
            combo.currentIndexChanged.connect(self._refresh)
        self.draft_on_cpu_box.toggled.connect(self._refresh)
        self.adaptive_box.toggled.connect(self._refresh)
        for spin in (
            self.k_spin,
            self.max_k_spin,
            self.top_k_spin,
            self.max_new_tokens_spin,
            self.seed_spin,
            self.p_min_spin,
            self.temperature_spin,
            self.top_p_spin,
        ):
            spin.valueChanged.connect(self._refresh)
        self._refresh()

    # --- public API ------------------------------------------------------------------------------

    @property
    def apply_button(self) -> QtWidgets.QPushButton:
        return self.buttons.button(QtWidgets.QDialogButtonBox.StandardButton.Apply)

    @property
    def ok_button(self) -> QtWidgets.QPushButton:
        return self.buttons.button(QtWidgets.QDialogButtonBox.StandardButton.Ok)

    def config(self) -> AppConfig:
        """The config the widgets show now (not necessarily valid)."""
        seed = self.seed_spin.value()
        return dataclasses.replace(
            self._config,
            target=self.target_picker.spec(),
            device=self.device_combo.currentData(),
            dtype=self.dtype_combo.currentData(),
            compiled=self.compiled_combo.currentData(),
            drafter=self.drafter_combo.currentData(),
            draft=self.draft_picker.spec(),
            draft_quantization=self.quantization_combo.currentData(),
            draft_on_cpu=self.draft_on_cpu_box.isChecked(),
            k_mode="adaptive" if self.adaptive_box.isChecked() else "fixed",
            k=self.k_spin.value(),
            max_k=self.max_k_spin.value(),
            p_min=round(self.p_min_spin.value(), 4),
            temperature=round(self.temperature_spin.value(), 4),
            top_p=round(self.top_p_spin.value(), 4),
            top_k=self.top_k_spin.value(),
            max_new_tokens=self.max_new_tokens_spin.value(),
            seed=None if seed < 0 else seed,
            system_prompt=self.system_prompt_edit.toPlainText(),
        )

    def apply(self) -> bool:
        """Validate, save to the store if there is one, and emit `applied`; False if refused."""
        config = self.config()
        refusal = self._refusal(config)
        if refusal:
            self.error_label.setText(refusal)
            return False
        if self._store is not None:
            config.save(self._store)
        self._config = config
        self.applied.emit(config)
        return True

    def done(self, result: int) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        super().done(result)

    # --- layout ----------------------------------------------------------------------------------

    def _lay_out(self) -> None:
        models = QtWidgets.QFormLayout()
        models.addRow("Target:", self.target_picker)
        models.addRow("", _note_label(HUB_NOTE))
        models.addRow("Drafter:", self.drafter_combo)
        models.addRow("Draft model:", self.draft_picker)
        models.addRow("", self.draft_reason)
        models.addRow("Draft quantization:", self.quantization_combo)
        models.addRow("", self.quantization_note)
        models.addRow("", self.draft_on_cpu_box)
        models.addRow("Device:", self.device_combo)
        models.addRow("Data type:", self.dtype_combo)
        models.addRow("torch.compile:", self.compiled_combo)
        models.addRow("Memory:", self.memory_label)

        speculation = QtWidgets.QFormLayout()
        speculation.addRow("", self.adaptive_box)
        speculation.addRow("K (fixed):", self.k_spin)
        speculation.addRow("Max K:", self.max_k_spin)
        speculation.addRow("p_min:", self.p_min_spin)

        sampling = QtWidgets.QFormLayout()
        sampling.addRow("Temperature (0 = greedy):", self.temperature_spin)
        sampling.addRow("Top-p:", self.top_p_spin)
        sampling.addRow("Top-k:", self.top_k_spin)
        sampling.addRow("Max new tokens:", self.max_new_tokens_spin)
        sampling.addRow("Seed:", self.seed_spin)
        sampling.addRow("Default system prompt:", self.system_prompt_edit)

        layout = QtWidgets.QVBoxLayout(self)
        for title, form in (("Models", models), ("Speculation", speculation), ("Sampling", sampling)):
            box = QtWidgets.QGroupBox(title)
            box.setLayout(form)
            layout.addWidget(box)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)

    def _show_config(self, config: AppConfig) -> None:
        self.target_picker.set_spec(config.target)
        self.draft_picker.set_spec(config.draft)
        _select(self.drafter_combo, config.drafter)
        _select(self.quantization_combo, config.draft_quantization)
        _select(self.device_combo, config.device)
        _select(self.dtype_combo, config.dtype)
        _select(self.compiled_combo, config.compiled)
        self.draft_on_cpu_box.setChecked(config.draft_on_cpu)
        self.adaptive_box.setChecked(config.k_mode == "adaptive")
        self.k_spin.setValue(config.k)
        self.max_k_spin.setValue(config.max_k)
        self.p_min_spin.setValue(config.p_min)
        self.temperature_spin.setValue(config.temperature)
        self.top_p_spin.setValue(config.top_p)
        self.top_k_spin.setValue(config.top_k)
        self.max_new_tokens_spin.setValue(config.max_new_tokens)
        self.seed_spin.setValue(-1 if config.seed is None else config.seed)
        self.system_prompt_edit.setPlainText(config.system_prompt)

    # --- state -----------------------------------------------------------------------------------

    def _refresh(self) -> None:
        config = self.config()
        drafting = config.drafter == "model"
        for widget in (self.draft_picker, self.quantization_combo, self.draft_on_cpu_box):
            widget.setEnabled(drafting)
        self.k_spin.setEnabled(config.k_mode == "fixed")
        self._probe("draft", (config.target, config.draft) if drafting else None, self._draft_probe(config))
        self._probe(
            "memory",
            (
                config.target,
                config.drafter,
                config.draft,
                config.draft_quantization,
                config.draft_on_cpu,
                config.device,
                config.dtype,
            ),
            lambda: estimate_memory_line(config),
        )
        self._probe(
            "quantization",
            (config.drafter, config.draft_quantization, config.draft_on_cpu, config.device),
            lambda: quantization_line(config),
        )
        self._update_buttons()

    def _draft_probe(self, config: AppConfig) -> Callable[[], Any] | None:
        if config.drafter != "model":
            return None
        tokenizers = self._tokenizers
        target, draft = config.target, config.draft
        listed = [spec for spec in catalog_specs() if spec != draft]

        def run():
            verdict = check_draft(target, draft, tokenizers)
            listed_verdicts = {spec: check_draft(target, spec, tokenizers) for spec in listed}
            return verdict, listed_verdicts

        return run

    def _probe(self, kind: str, inputs: Any, work: Callable[[], Any] | None) -> None:
        """Run work() on the probe thread unless its inputs are unchanged since the last request."""
        if kind in self._probe_inputs and self._probe_inputs[kind] == inputs:
            return
        self._probe_inputs[kind] = inputs
        token = self._tokens.get(kind, 0) + 1
        self._tokens[kind] = token
        if kind == "draft":
            self._draft_verdict = None
            self.draft_reason.setText(CHECKING if work else "")
        if work is None:
            self._probe_done.emit(kind, token, None, None)
            return

        def task():
            try:
                result, error = work(), None
            except Exception as exc:  # shown to the user; a probe must never take the dialog down
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the dialog was deleted meanwhile
                self._probe_done.emit(kind, token, result, error)

        self._executor.submit(task)

    def _on_probe_done(self, kind: str, token: int, result: Any, error: BaseException | None) -> None:
        if token != self._tokens.get(kind):
            return
        if kind == "draft":
            self._show_draft_verdict(result, error)
        elif kind == "memory":
            self.memory_label.setText(f"Could not estimate: {error}" if error else result)
        elif kind == "quantization":
            self.quantization_note.setText(f"{error}" if error else result)
        self._update_buttons()

    def _show_draft_verdict(self, result, error: BaseException | None) -> None:
        if isinstance(error, TandemError):  # a missing path, a pickle checkpoint, remote code: refused
            self._draft_verdict = (False, str(error))
        elif error is not None:
            self._draft_verdict = (None, f"Could not compare tokenizers: {error}")
        elif result is None:
            self._draft_verdict = (True, "")
        else:
            self._draft_verdict, listed = result
            for spec, (ok, reason) in listed.items():
                self.draft_picker.mark(spec, ok, reason)
        ok, reason = self._draft_verdict
        self.draft_reason.setText(reason if ok is not True else "")
        self.draft_reason.setStyleSheet("color: #c0392b" if ok is False else "")

    def _refusal(self, config: AppConfig) -> str:
        """Why config cannot be applied now, or ''."""
        try:
            config.validate()
        except SettingsError as exc:
            return str(exc)
        if config.drafter == "model":
            if self._draft_verdict is None:
                return CHECKING
            ok, reason = self._draft_verdict
            if ok is False:
                return reason
        return ""

    def _update_buttons(self) -> None:
        refusal = self._refusal(self.config())
        # the draft's verdict already has its own label beside the draft
        self.error_label.setText("" if refusal in (CHECKING, self.draft_reason.text()) else refusal)
        for button in (self.apply_button, self.ok_button):
            button.setEnabled(not refusal)

    def _ok(self) -> None:
        if self.apply():
            self.accept()


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


def _choices(options: dict[str, str]) -> QtWidgets.QComboBox:
    combo = QtWidgets.QComboBox()
    for value, label in options.items():
        combo.addItem(label, value)
    return combo


def _select(combo: QtWidgets.QComboBox, value: str) -> None:
    index = combo.findData(value)
    combo.setCurrentIndex(max(index, 0))


def _spin(low: int, high: int) -> QtWidgets.QSpinBox:
    spin = QtWidgets.QSpinBox()
    spin.setRange(low, high)
    return spin


def _double_spin(low: float, high: float, step: float) -> QtWidgets.QDoubleSpinBox:
    spin = QtWidgets.QDoubleSpinBox()
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setDecimals(2)
    return spin


def _note_label(text: str = "") -> QtWidgets.QLabel:
    label = QtWidgets.QLabel(text)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label
