from __future__ import annotations

import json
import shutil

import pytest

from app.config import STORE_KEY, AppConfig
from app.qt import QtWidgets
from app.sampling_fields import TIPS as SAMPLING_TIPS
from app.sampling_panel import SamplingPanel
from app.settings_dialog import APPLY_WHEN_CHECKED, CHECKING, SettingsDialog, SystemPromptDialog

SWAPPED_IDS = (200, 201)
PROBE_TIMEOUT_MS = 30_000


def copy_tokenizer_folder(source, destination):
    """A model folder with the source's config and tokenizer, and no weights."""
    destination.mkdir()
    for path in source.iterdir():
        if path.suffix in (".json", ".jinja") and path.name != "tandem-converted.json":
            shutil.copy(path, destination / path.name)
    return destination


@pytest.fixture
def same_tokenizer_draft(tmp_path, builtin_folder):
    return copy_tokenizer_folder(builtin_folder, tmp_path / "same-draft")


@pytest.fixture
def different_tokenizer_draft(tmp_path, builtin_folder):
    """Like the built-in tokenizer, but two vocabulary entries trade ids."""
    folder = copy_tokenizer_folder(builtin_folder, tmp_path / "other-draft")
    tokenizer_file = folder / "tokenizer.json"
    data = json.loads(tokenizer_file.read_text())
    vocab = data["model"]["vocab"]
    first, second = SWAPPED_IDS
    by_id = {token_id: token for token, token_id in vocab.items()}
    vocab[by_id[first]], vocab[by_id[second]] = second, first
    tokenizer_file.write_text(json.dumps(data))
    return folder


@pytest.fixture
def open_dialog(qtbot, store, builtin_folder):
    def make(config: AppConfig) -> SettingsDialog:
        dialog = SettingsDialog(config, store=store)
        qtbot.addWidget(dialog)
        return dialog

    return make


def wait_for_draft_verdict(qtbot, dialog):
    qtbot.waitUntil(lambda: dialog.draft_reason.text() != CHECKING, timeout=PROBE_TIMEOUT_MS)


def wait_until_applicable(qtbot, dialog):
    qtbot.waitUntil(
        lambda: dialog.apply_button.isEnabled() and not dialog.checking(), timeout=PROBE_TIMEOUT_MS
    )


def test_the_tokenizers_really_differ(builtin_tokenizer, different_tokenizer_draft):
    from transformers import AutoTokenizer

    edited = AutoTokenizer.from_pretrained(str(different_tokenizer_draft))
    first, second = SWAPPED_IDS
    assert edited.convert_ids_to_tokens(first) == builtin_tokenizer.convert_ids_to_tokens(second)
    assert edited.convert_ids_to_tokens(list(range(first))) == builtin_tokenizer.convert_ids_to_tokens(
        list(range(first))
    )


def test_incompatible_draft_is_refused_with_its_reason(qtbot, open_dialog, different_tokenizer_draft):
    dialog = open_dialog(AppConfig(drafter="model", draft=str(different_tokenizer_draft)))
    assert dialog.apply() is False  # not before the check has answered: it says it waits
    assert APPLY_WHEN_CHECKED in dialog.error_label.text()
    wait_for_draft_verdict(qtbot, dialog)
    reason = dialog.draft_reason.text()
    assert str(SWAPPED_IDS[0]) in reason
    assert not dialog.apply_button.isEnabled()
    assert not dialog.ok_button.isEnabled()
    assert dialog.apply() is False


def test_compatible_draft_can_be_applied(qtbot, open_dialog, same_tokenizer_draft, store):
    dialog = open_dialog(AppConfig(drafter="model", draft=str(same_tokenizer_draft)))
    wait_for_draft_verdict(qtbot, dialog)
    assert dialog.draft_reason.text() == ""
    wait_until_applicable(qtbot, dialog)
    with qtbot.waitSignal(dialog.applied) as applied:
        dialog.apply_button.click()
    assert applied.args[0].draft == str(same_tokenizer_draft)
    assert AppConfig.load(store).draft == str(same_tokenizer_draft)


def test_a_draft_path_that_does_not_exist_is_refused(qtbot, open_dialog, tmp_path):
    dialog = open_dialog(AppConfig(drafter="model", draft=str(tmp_path / "missing")))
    wait_for_draft_verdict(qtbot, dialog)
    assert "No model at" in dialog.draft_reason.text()
    assert not dialog.apply_button.isEnabled()


def test_switching_to_ngram_lifts_the_refusal(qtbot, open_dialog, different_tokenizer_draft):
    dialog = open_dialog(AppConfig(drafter="model", draft=str(different_tokenizer_draft)))
    wait_for_draft_verdict(qtbot, dialog)
    assert not dialog.apply_button.isEnabled()
    dialog.drafter_combo.setCurrentIndex(dialog.drafter_combo.findData("ngram"))
    wait_until_applicable(qtbot, dialog)
    assert not dialog.draft_picker.isEnabled()


def test_apply_carries_drafter_and_k_and_persists_without_closing(qtbot, open_dialog, store):
    dialog = open_dialog(AppConfig(drafter="ngram"))
    dialog.adaptive_box.setChecked(False)
    dialog.k_spin.setValue(5)
    dialog.sampling.temperature_spin.setValue(0.7)
    dialog.sampling.seed_spin.setValue(42)
    dialog.system_prompt_edit.setPlainText("Answer briefly.")
    wait_until_applicable(qtbot, dialog)
    with qtbot.waitSignal(dialog.applied) as applied, qtbot.assertNotEmitted(dialog.finished):
        dialog.apply_button.click()
    config = applied.args[0]
    speculation = config.speculation()
    assert (speculation.drafter, speculation.k) == ("ngram", 5)
    assert config.sampling().temperature == 0.7 and config.sampling().seed == 42
    assert store.get_setting(STORE_KEY)["k"] == 5
    assert AppConfig.load(store) == config


def test_ok_applies_and_closes_cancel_does_neither(qtbot, open_dialog, store):
    dialog = open_dialog(AppConfig(drafter="none"))
    dialog.max_k_spin.setValue(12)
    wait_until_applicable(qtbot, dialog)
    with qtbot.waitSignals([dialog.applied, dialog.accepted], order="strict"):
        dialog.ok_button.click()
    assert AppConfig.load(store).max_k == 12

    other = open_dialog(AppConfig(drafter="none"))
    other.max_k_spin.setValue(3)
    with qtbot.assertNotEmitted(other.applied):
        other.reject()
    assert AppConfig.load(store).max_k == 12


def test_fields_show_the_given_config(open_dialog):
    config = AppConfig(drafter="ngram", k_mode="fixed", k=9, max_k=10, top_k=40, seed=None, temperature=1.5)
    dialog = open_dialog(config)
    assert dialog.config() == config
    assert dialog.sampling.seed_spin.text() == "random"
    assert dialog.k_spin.isEnabled()


def test_the_side_panel_shows_and_reads_the_sampling_fields_as_the_dialog_does(qtbot):
    config = AppConfig(top_p=0.9, top_k=40, max_new_tokens=64, seed=7, temperature=1.5)
    panel = SamplingPanel(config)
    qtbot.addWidget(panel)
    assert panel.config() == config
    assert [w.toolTip() for w in panel.sampling.widgets()] == list(SAMPLING_TIPS.values())
    with qtbot.waitSignal(panel.changed) as changed:
        panel.sampling.seed_spin.setValue(-1)
    assert changed.args[0].seed is None and panel.sampling.seed_spin.text() == "random"


def test_an_invalid_setting_disables_apply_with_the_message(qtbot, open_dialog):
    dialog = open_dialog(AppConfig(drafter="ngram"))
    dialog.target_picker.set_spec("")
    assert not dialog.apply_button.isEnabled()
    assert dialog.error_label.text() == "Choose a target model."


def test_memory_estimate_and_quantization_note_are_shown(qtbot, open_dialog):
    dialog = open_dialog(AppConfig(drafter="model", draft_quantization="int8", device="cpu"))
    qtbot.waitUntil(lambda: dialog.memory_label.text() != "", timeout=PROBE_TIMEOUT_MS)
    assert any(verdict in dialog.memory_label.text() for verdict in ("fits", "tight", "won't fit"))
    assert "GiB" in dialog.memory_label.text()
    qtbot.waitUntil(lambda: "INT8" in dialog.quantization_note.text(), timeout=PROBE_TIMEOUT_MS)


def test_system_prompt_dialog_falls_back_to_the_default(qtbot):
    dialog = SystemPromptDialog("Talk like a pirate.", "You are a helpful assistant.")
    qtbot.addWidget(dialog)
    assert dialog.effective_prompt() == "Talk like a pirate."
    dialog.edit.clear()
    assert dialog.prompt() == ""
    assert dialog.effective_prompt() == "You are a helpful assistant."


# --- safe settings ---------------------------------------------------------------------------------


def test_a_target_path_that_does_not_exist_is_refused_and_not_saved(qtbot, open_dialog, store, tmp_path):
    dialog = open_dialog(AppConfig(drafter="ngram"))
    wait_until_applicable(qtbot, dialog)
    dialog.target_picker.set_spec(str(tmp_path / "no-such-model"))
    qtbot.waitUntil(lambda: "No model at" in dialog.target_reason.text(), timeout=PROBE_TIMEOUT_MS)
    assert "no-such-model" in dialog.target_reason.text()
    assert not dialog.apply_button.isEnabled() and not dialog.ok_button.isEnabled()
    with qtbot.assertNotEmitted(dialog.applied):
        assert dialog.apply() is False
    assert store.get_setting(STORE_KEY) is None


def test_a_missing_target_is_reported_once_and_not_again_under_the_draft(qtbot, open_dialog, tmp_path):
    from app.settings_dialog import DRAFT_AFTER_TARGET

    dialog = open_dialog(AppConfig(drafter="model"))
    dialog.target_picker.set_spec(str(tmp_path / "no-such-model"))
    qtbot.waitUntil(lambda: "No model at" in dialog.target_reason.text(), timeout=PROBE_TIMEOUT_MS)
    wait_for_draft_verdict(qtbot, dialog)
    assert dialog.draft_reason.text() == DRAFT_AFTER_TARGET
    assert dialog.error_label.text() == ""  # the reason is shown once, beside the target
    assert not dialog.apply_button.isEnabled()


def test_a_folder_without_weights_is_refused_as_a_target(qtbot, open_dialog, same_tokenizer_draft):
    dialog = open_dialog(AppConfig(drafter="ngram", target=str(same_tokenizer_draft)))
    qtbot.waitUntil(lambda: "safetensors" in dialog.target_reason.text(), timeout=PROBE_TIMEOUT_MS)
    assert not dialog.apply_button.isEnabled()


def test_cancel_after_apply_puts_back_the_config_the_dialog_opened_with(qtbot, open_dialog, store):
    opened = AppConfig(drafter="ngram", max_k=6)
    dialog = open_dialog(opened)
    dialog.max_k_spin.setValue(11)
    wait_until_applicable(qtbot, dialog)
    dialog.apply_button.click()
    assert AppConfig.load(store).max_k == 11
    with qtbot.waitSignal(dialog.applied) as reverted:
        dialog.buttons.button(dialog.buttons.StandardButton.Cancel).click()
    assert reverted.args[0] == opened
    assert AppConfig.load(store) == opened


# --- polish ----------------------------------------------------------------------------------------


@pytest.mark.qt_log_ignore("propagateSizeHints")  # the offscreen platform's, on show()
def test_the_dialog_fits_a_1366x768_screen(qtbot, open_dialog):
    dialog = open_dialog(AppConfig())
    dialog.show()
    qtbot.waitExposed(dialog)
    assert dialog.frameGeometry().height() <= 768 - 60  # a panel and the title bar
    assert dialog.frameGeometry().width() <= 1366
    assert dialog.minimumSizeHint().height() <= 768 - 60
    for label in (dialog.memory_label, dialog.draft_reason, dialog.target_reason, dialog.quantization_note):
        assert label.wordWrap()  # long notes wrap instead of being cut


def test_every_option_has_a_tooltip_and_p_min_is_explained(open_dialog):
    dialog = open_dialog(AppConfig())
    widgets = dialog.w.option_widgets()
    assert len(widgets) >= 20
    assert [w for w in widgets if not w.toolTip()] == []
    assert "confidence" in dialog.p_min_spin.toolTip()


def test_max_k_follows_adaptive_and_k_follows_fixed(open_dialog):
    dialog = open_dialog(AppConfig(k_mode="adaptive"))
    assert dialog.max_k_spin.isEnabled() and not dialog.k_spin.isEnabled()
    dialog.adaptive_box.setChecked(False)
    assert not dialog.max_k_spin.isEnabled() and dialog.k_spin.isEnabled()


def test_cuda_is_offered_only_when_torch_sees_a_gpu(qtbot, open_dialog):
    import torch

    dialog = open_dialog(AppConfig(device="cuda"))
    qtbot.waitUntil(lambda: dialog.device_note.text() != "", timeout=PROBE_TIMEOUT_MS)
    offered = [dialog.device_combo.itemData(i) for i in range(dialog.device_combo.count())]
    assert ("cuda" in offered) == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert dialog.device_combo.currentData() == "auto"
        assert "No CUDA GPU" in dialog.device_note.text()
        assert "not compiled" not in dialog.device_note.text()


def test_every_drafter_choice_says_why_in_one_line(open_dialog):
    dialog = open_dialog(AppConfig())
    for index in range(dialog.drafter_combo.count()):
        dialog.drafter_combo.setCurrentIndex(index)
        assert dialog.drafter_reason.text(), dialog.drafter_combo.currentData()
        assert "\n" not in dialog.drafter_reason.text()


def test_stop_strings_are_carried_one_per_line(qtbot, open_dialog, store):
    dialog = open_dialog(AppConfig(drafter="ngram"))
    dialog.stop_edit.setPlainText("END\n###")
    wait_until_applicable(qtbot, dialog)
    with qtbot.waitSignal(dialog.applied) as applied:
        dialog.apply_button.click()
    assert applied.args[0].stops() == ("END", "###")


def test_server_mode_needs_a_url_and_skips_the_local_model_checks(qtbot, open_dialog):
    dialog = open_dialog(AppConfig(drafter="ngram"))
    dialog.server_radio.setChecked(True)
    assert not dialog.target_picker.isEnabled()
    assert not dialog.apply_button.isEnabled() and "http" in dialog.error_label.text()
    dialog.server_url_edit.setText("http://127.0.0.1:8080/v1")
    assert dialog.apply_button.isEnabled()
    assert dialog.config().backend == "server"


def test_the_target_precision_is_a_choice_that_reaches_the_load_request(qtbot, open_dialog):
    from app.bridge import LoadRequest

    dialog = open_dialog(AppConfig(drafter="ngram"))
    dialog.precision_combo.setCurrentIndex(dialog.precision_combo.findData("int8"))
    config = dialog.config()
    assert config.target_precision == "int8"
    assert LoadRequest.from_config(config).target_precision == "int8"
    assert config.needs_load(AppConfig(drafter="ngram"))  # a new precision reloads the target
    qtbot.waitUntil(lambda: "not identical" in dialog.precision_note.text(), timeout=PROBE_TIMEOUT_MS)
    dialog.precision_combo.setCurrentIndex(dialog.precision_combo.findData("default"))
    assert dialog.precision_note.text() == ""


# --- the context ---------------------------------------------------------------------------------


def test_the_context_field_shows_the_default_and_says_what_it_costs(qtbot, open_dialog):
    from engine.settings import DEFAULT_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS

    dialog = open_dialog(AppConfig(drafter="ngram"))
    spin = dialog.w.context_spin
    assert spin.value() == DEFAULT_CONTEXT_TOKENS
    assert (spin.minimum(), spin.maximum()) == (MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
    models = dialog.tabs.widget(0)
    assert models.isAncestorOf(spin) and dialog.tabs.tabText(0) == "Models"
    form = next(f for f in models.findChildren(QtWidgets.QFormLayout) if f.indexOf(spin) >= 0)
    assert form.labelForField(spin).text() == "Context (tokens):"
    tip = spin.toolTip()
    assert "KV cache" in tip and "memory" in tip and "target's own maximum" in tip
    dialog.server_radio.setChecked(True)
    assert not spin.isEnabled()  # a server keeps its own context


def test_a_changed_context_is_saved_reaches_the_load_request_and_the_memory_line(qtbot, open_dialog, store):
    from app.bridge import LoadRequest

    dialog = open_dialog(AppConfig(drafter="ngram", device="cpu"))
    qtbot.waitUntil(lambda: "tokens of context" in dialog.memory_label.text(), timeout=PROBE_TIMEOUT_MS)
    assert "at 8,192 tokens of context" in dialog.memory_label.text()
    dialog.w.context_spin.setValue(4096)
    qtbot.waitUntil(lambda: "at 4,096 tokens" in dialog.memory_label.text(), timeout=PROBE_TIMEOUT_MS)
    wait_until_applicable(qtbot, dialog)
    with qtbot.waitSignal(dialog.applied) as applied:
        dialog.apply_button.click()
    config = applied.args[0]
    assert config.context == 4096 and store.get_setting(STORE_KEY)["context"] == 4096
    assert AppConfig.load(store).context == 4096
    assert LoadRequest.from_config(config).context == 4096
    assert config.needs_load(AppConfig(drafter="ngram", device="cpu"))  # the cache is sized at load
    assert open_dialog(AppConfig.load(store)).w.context_spin.value() == 4096
    # never more than the model's own: the built-in model reads 8,192 tokens
    dialog.w.context_spin.setValue(100_000)
    qtbot.waitUntil(lambda: "at 8,192 tokens" in dialog.memory_label.text(), timeout=PROBE_TIMEOUT_MS)


@pytest.mark.parametrize("stored", [10, 10**9, "lots", True])
def test_an_invalid_stored_context_shows_the_default(qtbot, open_dialog, store, stored):
    from engine.settings import DEFAULT_CONTEXT_TOKENS

    store.set_setting(STORE_KEY, AppConfig(drafter="ngram", max_k=11).to_dict() | {"context": stored})
    config = AppConfig.load(store)
    dialog = open_dialog(config)
    assert dialog.w.context_spin.value() == DEFAULT_CONTEXT_TOKENS
    assert dialog.max_k_spin.value() == 11  # the other settings stay as they were saved
    wait_until_applicable(qtbot, dialog)
    assert dialog.error_label.text() == ""


def test_the_kernel_in_use_and_why_is_shown(qtbot, store):
    from types import SimpleNamespace

    from app.bridge import EngineInfo, kernel_lines
    from app.qt import QtWidgets

    draft = SimpleNamespace(
        info={
            "kernel": "fbgemm-int8",
            "kernel_summary": "INT8 (fbgemm, dynamic)",
            "kernel_reason": "fastest kernel here",
        }
    )
    lines = kernel_lines(SimpleNamespace(info={}), draft)
    assert lines == ("draft: INT8 (fbgemm, dynamic) — fastest kernel here",)

    class Window(QtWidgets.QWidget):
        bridge = SimpleNamespace(info=EngineInfo("t", "d", "cpu", "int8", kernels=lines), probes=None)

    window = Window()
    qtbot.addWidget(window)
    dialog = SettingsDialog(AppConfig(drafter="ngram"), store, window)
    assert "fastest kernel here" in dialog.kernel_note.text()
    before_load = SettingsDialog(AppConfig(drafter="ngram"), store)
    qtbot.addWidget(before_load)
    assert "once the models have loaded" in before_load.kernel_note.text()
    dialog.done(0)


def test_token_trees_can_be_turned_off_and_reach_the_engine_settings(open_dialog):
    dialog = open_dialog(AppConfig())
    assert dialog.w.trees_box.isChecked() and "target" in dialog.w.trees_box.toolTip()
    dialog.w.trees_box.setChecked(False)
    config = dialog.config()
    assert config.trees is False and config.speculation().trees is False
    assert open_dialog(config).w.trees_box.isChecked() is False


def wheel(widget, steps: int = -1) -> None:
    """One notch of the mouse wheel over the middle of `widget` (negative: towards the user)."""
    from app.qt import QtCore, QtGui, QtWidgets

    centre = QtCore.QPointF(widget.rect().center())
    event = QtGui.QWheelEvent(
        centre,
        QtCore.QPointF(widget.mapToGlobal(centre.toPoint())),
        QtCore.QPoint(0, 0),
        QtCore.QPoint(0, 120 * steps),
        QtCore.Qt.MouseButton.NoButton,
        QtCore.Qt.KeyboardModifier.NoModifier,
        QtCore.Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QtWidgets.QApplication.sendEvent(widget, event)


@pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
def test_the_wheel_over_an_unfocused_field_changes_nothing(qtbot, open_dialog):
    """The mouse wheel over Settings changed "Draft quantization" from Auto to INT4 instead of scrolling."""
    dialog = open_dialog(AppConfig())
    dialog.show()
    qtbot.waitExposed(dialog)
    fields = [
        dialog.quantization_combo,
        dialog.precision_combo,
        dialog.k_spin,
        dialog.sampling.temperature_spin,
    ]
    before = [field.currentIndex() if hasattr(field, "currentIndex") else field.value() for field in fields]
    dialog.apply_button.setFocus()
    for field in fields:
        field.setEnabled(True)
        wheel(field)
    after = [field.currentIndex() if hasattr(field, "currentIndex") else field.value() for field in fields]
    assert after == before
    # once the user clicks into it (it has the focus), the wheel changes it, as it should
    dialog.quantization_combo.setFocus()
    qtbot.waitUntil(dialog.quantization_combo.hasFocus, timeout=2000)
    wheel(dialog.quantization_combo)
    assert dialog.quantization_combo.currentIndex() != before[0]


def test_ok_pressed_while_the_draft_is_checked_applies_when_the_check_answers(qtbot, open_dialog):
    """Seen: none -> auto, then OK within half a second did nothing (OK greyed, no reason shown)."""
    dialog = open_dialog(AppConfig(drafter="none"))
    wait_until_applicable(qtbot, dialog)
    dialog.drafter_combo.setCurrentIndex(dialog.drafter_combo.findData("auto"))
    assert dialog.ok_button.isEnabled()
    with qtbot.waitSignal(dialog.applied, timeout=PROBE_TIMEOUT_MS) as applied:
        dialog.ok_button.click()
        assert dialog.draft_reason.text() != CHECKING or APPLY_WHEN_CHECKED in dialog.error_label.text()
    assert applied.args[0].drafter == "auto"
    qtbot.waitUntil(lambda: dialog.result() == QtWidgets.QDialog.DialogCode.Accepted, timeout=1000)


def test_ok_pressed_while_checking_an_incompatible_draft_shows_why(
    qtbot, open_dialog, different_tokenizer_draft
):
    dialog = open_dialog(AppConfig(drafter="none", draft=str(different_tokenizer_draft)))
    wait_until_applicable(qtbot, dialog)
    dialog.drafter_combo.setCurrentIndex(dialog.drafter_combo.findData("model"))
    dialog.ok_button.click()
    wait_for_draft_verdict(qtbot, dialog)
    assert str(SWAPPED_IDS[0]) in dialog.draft_reason.text()
    for index in range(dialog.tabs.count()):  # the reason is in view whichever page is
        dialog.tabs.setCurrentIndex(index)
        beside = dialog.tabs.currentWidget().isAncestorOf(dialog.draft_reason)
        assert beside or str(SWAPPED_IDS[0]) in dialog.error_label.text()
    assert not dialog.ok_button.isEnabled() and dialog.result() != QtWidgets.QDialog.DialogCode.Accepted
