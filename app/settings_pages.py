"""The settings dialog's widgets and pages: what each option is called, what its tooltip says, where it sits.

No behaviour beyond layout here; app/settings_dialog.py reads and checks the values.
"""

from __future__ import annotations

from app.config import COMPILED, DTYPES, QUANTIZATIONS, TARGET_PRECISIONS
from app.form_widgets import ComboBox, choices, double_spin, form_layout, note_label, spin
from app.qt import Qt, QtWidgets, Signal
from app.sampling_fields import SamplingFields
from engine.settings import MAX_CONTEXT_TOKENS, MAX_K, MIN_CONTEXT_TOKENS

HUB_NOTE = "A hub id (owner/name) is downloaded when the models load; the status bar shows its progress."

DRAFTER_LABELS = {
    "auto": "Automatic (measured here)",
    "model": "Draft model",
    "ngram": "N-gram lookup",
    "suffix": "Suffix lookup",
    "head": "Draft head (trained on the target)",
    "none": "None (plain decoding)",
}

TIPS = {
    "backend": "Where replies are computed: the models on this computer, or an OpenAI-compatible server "
    "(tandem-cli serve, llama.cpp's llama-server, vLLM, SGLang).",
    "server_url": "The server's base URL, e.g. http://127.0.0.1:8080/v1.",
    "api_key": "Sent as a bearer token. Kept in the system keyring (or a private file), never in the "
    "conversation database or the settings.",
    "target": "The model that answers. Its output is exactly what you get: drafting only makes it faster.",
    "target_precision": "The target's precision. Its output is exactly what that precision would give: "
    "INT8/INT4 save memory, fp32 is the reference. 'default' runs a GGUF file in its own quantization on "
    "a CPU (as llama.cpp does), other models at fp32, and bf16/fp16 on a GPU.",
    "drafter": "What proposes tokens for the target to check in one pass. Automatic tries the drafters "
    "on this machine and keeps the fastest; None decodes plainly.",
    "draft": "A small model sharing the target's tokenizer. Models that cannot draft for this target are "
    "greyed out, with the reason in their tooltip.",
    "quantization": "Store the draft's weights in 8 or 4 bits: less memory, and on CPUs INT8 is faster.",
    "draft_on_cpu": "Keep the draft in main memory and run it on the CPU, leaving GPU memory to the target.",
    "context": "Tokens a conversation may hold, your messages and the replies together. The KV cache is "
    "allocated at this size when the models load, so memory grows with it (the Memory line counts it); "
    "a longer conversation is refused with what to do. Never more than the target's own maximum: a "
    "larger number gives the model's own context. Changing it loads the models again.",
    "device": "Where the models run. 'auto' picks the GPU when torch sees one. 'cuda' is offered only "
    "when torch sees a CUDA GPU.",
    "dtype": "The target's number format. 'auto' is bf16/fp16 on a GPU and fp32 on a CPU.",
    "compiled": "torch.compile the target's forward. 'auto': on CUDA at load time; on a CPU in the background "
    "the first time (replies run uncompiled meanwhile), then from the cache in seconds at every start. "
    "'on': at load time everywhere. 'off': never.",
    "adaptive": "Choose K, the number of drafted tokens per round, from what this machine measures: "
    "acceptance and the cost of checking K tokens.",
    "k": "Draft exactly this many tokens every round (when Adaptive K is off).",
    "max_k": "The most tokens adaptive K may draft in one round.",
    "trees": "In greedy replies (temperature 0), verify the drafter's other candidates (the head's "
    "second choices, other earlier occurrences of a lookup match) in the same target forward, where "
    "the tokens they are expected to save pay for what they cost on this machine. The output stays "
    "the target's either way.",
    "p_min": "Stop drafting a round early once the draft's confidence in its next token falls below "
    "p_min (0 = never). Higher values waste less verify work on guesses the target would reject.",
    "stop": "The reply ends when it produces any of these strings, one per line; the string is not shown.",
    "system_prompt": "Sent before every new conversation; each conversation can override it.",
    "auto_titles": "After a conversation's first reply, the model writes a short title for it (a few "
    "tokens; a message you send meanwhile goes first). Off: the first message is the title.",
}


class ModelPicker(QtWidgets.QWidget):
    """An editable list of model specs with buttons to pick a local folder or a GGUF file."""

    changed = Signal()

    def __init__(self, specs: list[str], parent: QtWidgets.QWidget | None = None):
        super().__init__(parent)
        self.combo = ComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QtWidgets.QComboBox.InsertPolicy.NoInsert)
        self.combo.setSizeAdjustPolicy(
            QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.combo.setMinimumContentsLength(24)
        self.add_specs(specs)
        folder_button = QtWidgets.QPushButton("Folder…")
        gguf_button = QtWidgets.QPushButton("GGUF…")
        folder_button.setToolTip("Choose a Hugging Face model folder (safetensors)")
        gguf_button.setToolTip("Choose a .gguf file")
        folder_button.clicked.connect(self._pick_folder)
        gguf_button.clicked.connect(self._pick_gguf)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 1)
        layout.addWidget(folder_button)
        layout.addWidget(gguf_button)
        self.combo.currentTextChanged.connect(lambda _text: self.changed.emit())

    def add_specs(self, specs: list[str]) -> None:
        for spec in specs:
            if self.combo.findData(spec) < 0:
                self.combo.addItem(spec, spec)

    def specs(self) -> list[str]:
        return [self.combo.itemData(i) for i in range(self.combo.count())]

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


class SettingsWidgets:
    """Every input and note of the settings dialog, with its tooltip, laid out on tabs."""

    def __init__(self, specs: list[str]):
        self.local_radio = QtWidgets.QRadioButton("This computer")
        self.server_radio = QtWidgets.QRadioButton("A server")
        self.server_url_edit = QtWidgets.QLineEdit()
        self.server_url_edit.setPlaceholderText("http://127.0.0.1:8080/v1")
        self.api_key_edit = QtWidgets.QLineEdit()
        self.api_key_edit.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
        self.api_key_edit.setPlaceholderText("optional")
        self.target_picker = ModelPicker(specs)
        self.draft_picker = ModelPicker(specs)
        self.drafter_combo = choices(DRAFTER_LABELS)
        self.precision_combo = choices({p: p if p == "default" else p.upper() for p in TARGET_PRECISIONS})
        self.quantization_combo = choices(
            {q: q.upper() if q not in ("none", "auto") else q.title() for q in QUANTIZATIONS}
        )
        self.draft_on_cpu_box = QtWidgets.QCheckBox("Run the draft on the CPU")
        self.device_combo = choices({"auto": "auto", "cpu": "cpu"})
        self.dtype_combo = choices({d: d for d in DTYPES})
        self.compiled_combo = choices({c: c for c in COMPILED})
        self.context_spin = spin(MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setGroupSeparatorShown(True)
        self.target_reason = note_label()
        self.draft_reason = note_label()
        self.draft_reason.setObjectName("draftReason")
        self.drafter_reason = note_label()
        self.quantization_note = note_label()
        self.precision_note = note_label()
        self.device_note = note_label()
        self.kernel_note = note_label()
        self.memory_label = note_label()

        self.adaptive_box = QtWidgets.QCheckBox("Adaptive K")
        self.k_spin = spin(1, MAX_K)
        self.max_k_spin = spin(1, MAX_K)
        self.p_min_spin = double_spin(0.0, 0.99, 0.05)
        self.trees_box = QtWidgets.QCheckBox("Token trees")

        self.sampling = SamplingFields()
        self.stop_edit = QtWidgets.QPlainTextEdit()
        self.stop_edit.setPlaceholderText("one stop string per line")
        self.stop_edit.setMaximumHeight(60)
        self.system_prompt_edit = QtWidgets.QPlainTextEdit()
        self.system_prompt_edit.setMaximumHeight(80)
        self.titles_box = QtWidgets.QCheckBox("Let the model title new conversations")
        self._set_tooltips()

    def _set_tooltips(self) -> None:
        for widget, tip in (
            (self.local_radio, "backend"),
            (self.server_radio, "backend"),
            (self.server_url_edit, "server_url"),
            (self.api_key_edit, "api_key"),
            (self.target_picker.combo, "target"),
            (self.drafter_combo, "drafter"),
            (self.precision_combo, "target_precision"),
            (self.draft_picker.combo, "draft"),
            (self.quantization_combo, "quantization"),
            (self.draft_on_cpu_box, "draft_on_cpu"),
            (self.device_combo, "device"),
            (self.dtype_combo, "dtype"),
            (self.compiled_combo, "compiled"),
            (self.context_spin, "context"),
            (self.adaptive_box, "adaptive"),
            (self.k_spin, "k"),
            (self.max_k_spin, "max_k"),
            (self.p_min_spin, "p_min"),
            (self.trees_box, "trees"),
            (self.stop_edit, "stop"),
            (self.system_prompt_edit, "system_prompt"),
            (self.titles_box, "auto_titles"),
        ):
            widget.setToolTip(TIPS[tip])

    def option_widgets(self) -> list[QtWidgets.QWidget]:
        """Every input the user sets (each has a tooltip)."""
        own = [
            w
            for w in vars(self).values()
            if isinstance(
                w,
                (
                    QtWidgets.QAbstractButton,
                    QtWidgets.QComboBox,
                    QtWidgets.QAbstractSpinBox,
                    QtWidgets.QLineEdit,
                    QtWidgets.QPlainTextEdit,
                ),
            )
        ]
        return [*own, *self.sampling.widgets()]

    def tabs(self) -> QtWidgets.QTabWidget:
        tabs = QtWidgets.QTabWidget()
        tabs.addTab(scrolled(self._models_form()), "Models")
        tabs.addTab(scrolled(self._speculation_form()), "Speculation")
        tabs.addTab(scrolled(self._sampling_form()), "Sampling")
        return tabs

    def _models_form(self) -> QtWidgets.QFormLayout:
        where = QtWidgets.QHBoxLayout()
        where.addWidget(self.local_radio)
        where.addWidget(self.server_radio)
        where.addStretch(1)
        form = form_layout()
        form.addRow("Run on:", where)
        form.addRow("Server URL:", self.server_url_edit)
        form.addRow("API key:", self.api_key_edit)
        form.addRow("Target:", self.target_picker)
        form.addRow("", self.target_reason)
        form.addRow("", note_label(HUB_NOTE))
        form.addRow("Target precision:", self.precision_combo)
        form.addRow("", self.precision_note)
        form.addRow("Context (tokens):", self.context_spin)
        form.addRow("Drafter:", self.drafter_combo)
        form.addRow("", self.drafter_reason)
        form.addRow("Draft model:", self.draft_picker)
        form.addRow("", self.draft_reason)
        form.addRow("Draft quantization:", self.quantization_combo)
        form.addRow("", self.quantization_note)
        form.addRow("", self.draft_on_cpu_box)
        form.addRow("Device:", self.device_combo)
        form.addRow("", self.device_note)
        form.addRow("Data type:", self.dtype_combo)
        form.addRow("torch.compile:", self.compiled_combo)
        form.addRow("Kernel:", self.kernel_note)
        form.addRow("Memory:", self.memory_label)
        return form

    def _speculation_form(self) -> QtWidgets.QFormLayout:
        form = form_layout()
        form.addRow("", self.adaptive_box)
        form.addRow("K (fixed):", self.k_spin)
        form.addRow("Max K:", self.max_k_spin)
        form.addRow("p_min:", self.p_min_spin)
        form.addRow("", note_label(TIPS["p_min"]))
        form.addRow("", self.trees_box)
        form.addRow("", note_label(TIPS["trees"]))
        return form

    def _sampling_form(self) -> QtWidgets.QFormLayout:
        form = form_layout()
        self.sampling.add_rows(form)
        form.addRow("Stop strings:", self.stop_edit)
        form.addRow("Default system prompt:", self.system_prompt_edit)
        form.addRow("", self.titles_box)
        return form


def scrolled(form: QtWidgets.QFormLayout) -> QtWidgets.QScrollArea:
    page = QtWidgets.QWidget()
    column = QtWidgets.QVBoxLayout(page)
    column.setContentsMargins(0, 0, 0, 0)
    column.addLayout(form)
    column.addStretch(1)  # spare height goes below the last row, not between the notes
    area = QtWidgets.QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(page)
    return area
