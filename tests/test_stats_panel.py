from __future__ import annotations

import pytest

from app.stats_panel import FALLBACK_TEXT, StatsPanel
from engine.stats import GenerationStats


def round_stats(rounds: int = 3, drafter: str = "model:smollm2-int8", k_mode: str = "fixed", k: int = 4):
    """Stats as the loop leaves them after `rounds` rounds of K=k drafting."""
    stats = GenerationStats(drafter=drafter, k_mode=k_mode, current_k=k)
    for i in range(rounds):
        accepted = i % (k + 1)
        stats.rounds += 1
        stats.drafted += k
        stats.accepted += accepted
        stats.accepted_lengths.append(accepted + 1)
        stats.k_history.append(k)
        stats.generated_tokens += accepted + 1
    stats.per_position_drafted = [rounds] * k
    stats.per_position_accepted = [rounds, rounds // 2, 1, 0][:k]
    stats.draft_time_s, stats.verify_time_s = 0.25, 0.75
    stats.prefill_time_s, stats.total_time_s = 0.2, 1.2
    stats.ttft_s = 0.31
    stats.target_step_time_s = 0.05
    return stats


@pytest.fixture
def panel(qtbot):
    widget = StatsPanel(plot_interval_s=0.1)
    qtbot.addWidget(widget)
    return widget


def test_numbers_follow_the_stats(panel):
    stats = round_stats(rounds=4, k=4)
    panel.update_stats(stats)
    assert panel.value_text("drafter") == "draft model smollm2-int8"
    assert panel.value_text("k") == "4 (fixed)"
    assert panel.value_text("acceptance") == f"{stats.accepted / stats.drafted:.0%} (6 of 16 drafted)"
    assert panel.value_text("mean_accepted") == "2.50 tokens/round"
    assert panel.value_text("tokens_per_s") == f"{10 / 1.2:.1f}"
    assert panel.value_text("ttft") == "0.31 s"
    assert panel.value_text("time_split") == "0.25 s / 0.75 s (25% drafting)"
    assert panel.value_text("speedup") == "×0.50 (slower, measured)"
    assert panel.note_text() == ""


def test_switching_drafter_and_k_shows_in_the_panel(panel):
    panel.update_stats(round_stats(drafter="model:a", k_mode="fixed", k=4))
    panel.update_stats(round_stats(drafter="ngram", k_mode="adaptive", k=6))
    assert panel.value_text("drafter") == "n-gram lookup"
    assert panel.value_text("k") == "6 (adaptive)"


def test_measured_speedup_above_one_reads_faster(panel):
    stats = round_stats()
    stats.target_step_time_s = 0.5
    panel.update_stats(stats)
    assert panel.value_text("speedup") == f"×{stats.speedup:.2f} (faster, measured)"
    stats.target_step_time_s = None
    panel.update_stats(stats)
    assert panel.value_text("speedup") == "not measured yet"


def test_fallback_to_plain_decoding_is_said_with_the_note(panel):
    stats = round_stats()
    stats.fallback_to_plain = True
    stats.note = "draft acceptance 12% over the last 20 rounds"
    panel.update_stats(stats)
    assert panel.note_text() == FALLBACK_TEXT + "\n" + stats.note
    assert panel.value_text("k") == "—"


def test_first_update_plots_at_once(panel):
    stats = round_stats(rounds=3, k=4)
    panel.update_stats(stats)
    assert panel.plotted_lengths() == [1.0, 2.0, 3.0]
    assert panel.plotted_position_acceptance() == pytest.approx([1.0, 1 / 3, 1 / 3, 0.0])


def test_plot_redraws_are_throttled_but_the_last_round_is_drawn(panel, qtbot):
    stats = GenerationStats(drafter="ngram", current_k=2)
    for round_index in range(200):
        stats = stats.copy()
        stats.accepted_lengths.append(1 + round_index % 3)
        panel.update_stats(stats)
    assert panel.plot_redraws == 1
    assert len(panel.plotted_lengths()) == 1
    qtbot.waitUntil(lambda: len(panel.plotted_lengths()) == 200, timeout=2000)
    assert panel.plot_redraws == 2


def test_reset_clears_numbers_and_plots(panel):
    stats = round_stats()
    stats.fallback_to_plain = True
    panel.update_stats(stats)
    panel.reset()
    assert panel.value_text("acceptance") == "—"
    assert panel.note_text() == ""
    assert panel.plotted_lengths() == []
    assert panel.plotted_position_acceptance() == []


def test_show_saved_displays_a_stored_stats_dict(panel):
    stats = round_stats(rounds=5, drafter="ngram", k_mode="adaptive", k=3)
    stored = stats.to_dict() | {"written_by_a_newer_version": 1}
    panel.show_saved(stored)
    assert panel.value_text("drafter") == "n-gram lookup"
    assert panel.value_text("k") == "3 (adaptive)"
    assert panel.value_text("mean_accepted") == f"{stats.mean_accepted_length:.2f} tokens/round"
    assert panel.plotted_lengths() == [float(n) for n in stats.accepted_lengths]
    panel.show_saved(None)
    assert panel.value_text("drafter") == "—"


def test_plain_decoding_has_no_acceptance(panel):
    panel.update_stats(GenerationStats(drafter="none", generated_tokens=5, total_time_s=1.0))
    assert panel.value_text("drafter") == "none (target alone)"
    assert panel.value_text("acceptance") == "—"
    assert panel.value_text("tokens_per_s") == "5.0"
