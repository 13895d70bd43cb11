from __future__ import annotations

import pytest

from app.qt import QtGui
from app.stats_format import PLAIN_NOTICE, WAITING, footer_line
from app.stats_panel import PANEL_WIDTH, StatsPanel
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
    assert panel.value_text("tokens_per_s") == f"{10 / 1.0:.1f} tok/s"  # decode time: total less prefill
    assert panel.value_text("ttft") == "0.31 s"
    assert panel.value_text("time_split") == "0.25 s / 0.75 s (25% drafting)"
    assert panel.value_text("speedup") == "≈ ×0.50 (slower, estimate)"
    assert "measured" not in panel.value_text("speedup")
    assert panel.note_text() == ""


def test_switching_drafter_and_k_shows_in_the_panel(panel):
    panel.update_stats(round_stats(drafter="model:a", k_mode="fixed", k=4))
    panel.update_stats(round_stats(drafter="ngram", k_mode="adaptive", k=6))
    assert panel.value_text("drafter") == "n-gram lookup"
    assert panel.value_text("k") == "6 (adaptive)"
    stats = round_stats(drafter="ngram", k_mode="adaptive", k=6)
    stats.current_k = 0
    panel.update_stats(stats)
    assert panel.value_text("k") == "0 (adaptive: the last round drafted nothing)"


def test_measured_speedup_above_one_reads_faster(panel):
    stats = round_stats()
    stats.target_step_time_s = 0.5
    panel.update_stats(stats)
    assert panel.value_text("speedup") == f"≈ ×{stats.speedup:.2f} (faster, estimate)"
    stats.target_step_time_s = None
    panel.update_stats(stats)
    assert panel.value_text("speedup") == "not estimated yet"


def test_fallback_to_plain_decoding_is_one_notice_in_one_wording(panel):
    stats = GenerationStats(drafter="auto", generated_tokens=30, rounds=30, plain_steps=30, total_time_s=3.0)
    stats.fallback_to_plain = True
    stats.note = (
        "No draft model is loaded, so drafting uses n-gram lookup. Speculation measured slower than the "
        "target alone here (acceptance 32%); decoding plainly and re-trying every 16 tokens."
    )
    panel.update_stats(stats)
    assert panel.note_text() == PLAIN_NOTICE + "\nNo draft model is loaded, so drafting uses n-gram lookup."
    assert panel.note_text().count("slower") == 1
    stats.note = "No drafter is expected to beat the target alone here; decoding plainly."
    panel.update_stats(stats)
    assert panel.note_text() == PLAIN_NOTICE
    assert panel.value_text("k") == "—"
    assert "decoded plainly" in panel.value_text("speedup") and "decoded plainly" in footer_line(stats)


def test_a_reply_that_drafted_then_stepped_plainly_is_never_called_plain(panel):
    """One panel showed "×1.43 faster" beside "…so this reply was decoded plainly" while 8 of its 18
    rounds drafted: the notice and the figure must come from one rule and agree."""
    stats = GenerationStats(drafter="auto", rounds=18, drafted=20, accepted=14, generated_tokens=40)
    stats.plain_steps, stats.plain_step_time_s = 10, 1.0  # 0.1 s per plain step, in this reply
    stats.prefill_time_s, stats.total_time_s = 0.2, 3.0
    stats.fallback_to_plain = True
    stats.note = "Speculation measured slower than the target alone here; decoding plainly."
    panel.update_stats(stats)
    assert stats.verdict == "faster"
    assert panel.value_text("speedup") == f"×{stats.speedup:.2f} (faster, measured in this reply)"
    assert "decoded plainly" not in panel.note_text() and "slower" not in panel.note_text()
    assert "10 of these 18 rounds" in panel.note_text()
    assert f"×{stats.speedup:.2f} vs target alone (faster, measured in this reply)" in footer_line(stats)


def test_speedup_measured_in_the_reply_is_not_called_an_estimate(panel):
    stats = round_stats()
    stats.plain_steps, stats.plain_step_time_s = 10, 2.0  # 0.2 s per plain token, in this very reply
    panel.update_stats(stats)
    assert panel.value_text("speedup") == f"×{stats.speedup:.2f} (faster, measured in this reply)"
    assert "estimate" not in footer_line(stats.to_dict())


def test_figures_a_server_did_not_report_say_so(panel):
    stats = round_stats()
    stats.source, stats.unreported = "llama.cpp", ["ttft_s", "speedup"]
    panel.update_stats(stats)
    assert panel.value_text("ttft") == "not reported by this server"
    assert panel.value_text("speedup") == "not reported by this server"
    assert "×" not in footer_line(stats.to_dict())


@pytest.mark.parametrize("drafted, accepted", [(0, 0), (4, 0)])
def test_no_speedup_claim_without_accepted_drafts(panel, drafted, accepted):
    stats = GenerationStats(drafter="ngram", generated_tokens=20, drafted=drafted, accepted=accepted)
    stats.total_time_s, stats.target_step_time_s = 1.0, 0.2  # would read as ×4.00
    panel.update_stats(stats)
    assert "×" not in panel.value_text("speedup") and panel.value_text("speedup").startswith("none")
    assert "×" not in footer_line(stats.to_dict())


def test_panel_and_footer_show_the_same_numbers(panel):
    stats = round_stats(rounds=4, k=4)
    panel.update_stats(stats)
    line = footer_line(stats.to_dict())
    assert panel.value_text("tokens_per_s") in line
    assert f"×{stats.speedup:.2f}" in line and "estimate" in line
    assert panel.value_text("acceptance").split()[0] in line


def test_empty_state_names_the_drafter_and_hides_the_charts(panel):
    panel.set_drafter("model:smollm2-int8")
    assert panel.value_text("drafter") == "draft model smollm2-int8"
    assert panel.value_text("tokens_per_s") == WAITING
    assert not panel.charts_visible()
    panel.update_stats(round_stats())
    assert panel.charts_visible()


def visible_ticks(plot, axis_name: str) -> list[float]:
    axis = plot.getAxis(axis_name)
    low, high = plot.viewRange()[0 if axis_name == "bottom" else 1]
    return [value for _, values in axis.tickValues(low, high, 200) for value in values]


def test_charts_have_integer_ticks_no_negative_axes_no_legend_and_narrow_bars(panel):
    stats = round_stats(rounds=3, k=1)
    stats.per_position_drafted, stats.per_position_accepted = [3], [2]
    panel.update_stats(stats)
    for plot in panel.plots():
        assert plot.plotItem.legend is None
        for name in ("bottom", "left"):
            ticks = visible_ticks(plot, name)
            assert ticks and all(t == int(t) and t >= 0 for t in ticks), (name, ticks)
        (x_low, _), (y_low, _) = plot.viewRange()
        assert x_low >= 0 and y_low >= 0
    bars = panel.plots()[1]
    x_low, x_high = bars.viewRange()[0]
    assert 0.6 / (x_high - x_low) < 0.25, "a single bar must not fill the plot"


def test_a_short_axis_spaces_its_labels_so_they_never_touch(panel):
    """At the window's smallest the rounds chart's left axis is about 50 pixels tall: it stacked
    0, 1, ..., 6 there, label on label."""
    from app.stats_panel import MIN_TICK_SPACING_PX

    axis = panel.plots()[0].getAxis("left")
    for pixels in (40, 50, 80, 200):
        ticks = [value for _, values in axis.tickValues(0, 6, pixels) for value in values]
        assert len(ticks) >= 2 and (ticks[1] - ticks[0]) * pixels / 6 >= MIN_TICK_SPACING_PX, (pixels, ticks)
    assert [v for _, values in axis.tickValues(0, 6, 200) for v in values] == [0, 1, 2, 3, 4, 5, 6]


def test_panel_keeps_its_width_and_follows_the_palette(panel):
    panel.update_stats(round_stats())
    assert panel.width() == PANEL_WIDTH
    stats = round_stats()
    stats.fallback_to_plain, stats.note = True, "a very long note " * 30
    panel.update_stats(stats)
    assert panel.width() == PANEL_WIDTH and panel.maximumWidth() == PANEL_WIDTH
    palette = QtGui.QPalette()
    palette.setColor(QtGui.QPalette.ColorRole.Base, QtGui.QColor("#1e1f22"))
    panel.setPalette(palette)
    plot = panel.plots()[0]
    assert plot.backgroundBrush().color().name() == "#1e1f22"


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
    assert panel.value_text("acceptance") == WAITING
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
    assert panel.value_text("drafter") == "no model loaded yet"


def test_plain_decoding_has_no_acceptance(panel):
    panel.update_stats(GenerationStats(drafter="none", generated_tokens=5, total_time_s=1.0))
    assert panel.value_text("drafter") == "none (target alone)"
    assert panel.value_text("acceptance") == "—"
    assert panel.value_text("tokens_per_s") == "5.0 tok/s"
    assert panel.value_text("speedup") == "none (target alone)"


def test_a_reply_that_drafted_nothing_shows_no_drafting_figures(panel):
    """Seen: "Draft/verify time (2-3 % drafting)" and "1.00 tokens/round" on replies that drafted nothing."""
    stats = GenerationStats(
        drafter="ngram", k_mode="adaptive", rounds=12, plain_steps=12, generated_tokens=13
    )
    stats.accepted_lengths, stats.drafter_history = [1] * 12, ["none"] * 12
    stats.draft_time_s, stats.verify_time_s = 0.012, 0.5  # a lookup that found nothing still takes time
    stats.round_time_s, stats.round_tokens, stats.plain_step_time_s = 0.6, 12, 0.6
    stats.prefill_time_s, stats.total_time_s = 0.1, 0.8
    panel.update_stats(stats)
    for key in ("k", "acceptance", "mean_accepted", "time_split", "trees"):
        assert panel.value_text(key) == "—", key
    assert "×" not in panel.value_text("speedup") and "decoded plainly" in panel.value_text("speedup")
    assert "accepted" not in footer_line(stats) and "×" not in footer_line(stats)


def test_the_target_alone_reads_one_and_about_the_same_is_neither_faster_nor_slower(panel):
    alone = GenerationStats(drafter="none", rounds=10, plain_steps=10, generated_tokens=11)
    alone.round_time_s = alone.plain_step_time_s = 0.5
    alone.round_tokens, alone.total_time_s = 10, 0.6
    panel.update_stats(alone)
    assert panel.value_text("speedup") == "×1.00 (the target alone, its own baseline)"
    even = round_stats(rounds=10)
    even.plain_steps, even.plain_step_time_s = 4, 0.4  # 0.1 s a token alone, in this reply
    even.round_tokens, even.round_time_s = 20, 2.02  # 0.101 s a token with drafting: ×0.99
    panel.update_stats(even)
    assert panel.value_text("speedup") == "×0.99 (about the same, measured in this reply)"
    assert "faster" not in footer_line(even) and "slower" not in footer_line(even)


def test_the_prompt_reading_speed_shows_in_the_panel_and_under_a_long_prompts_reply(qtbot):
    """Prompt tokens computed over the prompt's time: in the panel for every reply, under the reply
    (its footer) when the prompt was long enough for its reading to count."""
    stats = round_stats()
    stats.prefill_tokens, stats.prefill_time_s = 600, 0.5
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.update_stats(stats)
    assert panel.value_text("prompt_speed") == "prompt read at 1,200 tok/s"
    assert "prompt read at 1,200 tok/s" in footer_line(stats.to_dict())
    stats.prefill_tokens = 40  # a follow-up: most of the prompt was cached
    assert "prompt read" not in footer_line(stats)
    stats.prefill_tokens, stats.unreported = 600, ["prefill_time_s"]
    assert "prompt read" not in footer_line(stats)
    panel.update_stats(stats)
    assert panel.value_text("prompt_speed") == "not reported by this server"
