"""The words and numbers shown for a reply's GenerationStats, in one place.

The stats panel and the footer under each reply both read from here, so the same reply shows the
same tokens/s and the same speed-up in both. Pure functions, no Qt: a reply's stats arrive either as
a live GenerationStats or as the dict stored with the message (GenerationStats.to_dict()).

The speed-up is GenerationStats.speedup, and GenerationStats.verdict is the one rule for what is said
of it (faster, about the same, slower, decoded plainly, no claim), here and in the Markdown export.
When the reply had enough plain steps of its own (the loop takes a few in every reply that drafts),
the target alone was timed at the same moment and the figure says "measured in this reply";
otherwise it is compared with the engine's calibration and is labelled an estimate
(speedup_is_estimate). A reply decoded by the target alone reads ×1.00: it is its own baseline. A
reply that drafted nothing shows no drafting figures (K, tokens per round, draft/verify time), and
one with no draft token accepted makes no speed-up claim. A figure a remote server did not report
(GenerationStats.unreported) says so instead of showing 0.
"""

from __future__ import annotations

import re
from dataclasses import fields

from engine.stats import GenerationStats

DASH = "—"
WAITING = "after the first reply"
PLAIN_NOTICE = (
    "Drafting was slower than the target alone on this machine, so this reply was decoded plainly "
    "(Tandem tries drafting again every so often)."
)
# a reply that drafted, then stepped plainly: its speed-up covers both, so nothing here says "slower"
PARTLY_PLAIN_NOTICE = (
    "Tandem decoded {plain} of these {rounds} rounds plainly, where drafting was not paying on this "
    "machine; the speed-up above covers the whole reply."
)
SPEEDUP_TOOLTIP = (
    "The target alone's time per token over this reply's time per token. \"Measured in this reply\" "
    "times the target alone in plain steps of this very reply, under the same load; an estimate uses "
    "the timing taken when the model loaded. Within 3 % of ×1.00 is about the same speed."
)
# verdicts that come with a figure
SPEED_VERDICTS = ("faster", "about the same", "slower")
UNREPORTED = "not reported by this server"
# a prompt this long takes long enough to read that the footer under its reply says how fast it was read
LONG_PROMPT_TOKENS = 512
# which GenerationStats names each shown value is computed from
SOURCES = {
    "k": ("current_k",),
    "acceptance": ("acceptance_rate", "drafted", "accepted"),
    "mean_accepted": ("mean_accepted_length", "accepted_lengths"),
    "tokens_per_s": ("decode_tokens_per_s", "tokens_per_s"),
    "ttft": ("ttft_s",),
    "prompt_speed": ("prefill_time_s", "prefill_tokens"),
    "time_split": ("draft_time_s", "verify_time_s"),
    "trees": ("tree_rounds", "off_chain_rounds"),
    "speedup": ("speedup",),
}
# The engine words the fallback in its own notes too ("Speculation measured slower…", "…decoding
# plainly."); with the fallback flag set, one notice says it once and those sentences are dropped.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_FALLBACK_WORDS = re.compile(r"slower|plainly|plain decoding", re.IGNORECASE)

# (key, label) in display order
FIELDS = (
    ("drafter", "Drafter"),
    ("k", "Current K"),
    ("acceptance", "Acceptance rate"),
    ("mean_accepted", "Mean accepted length"),
    ("tokens_per_s", "Decode speed"),
    ("ttft", "Time to first token"),
    ("prompt_speed", "Prompt reading"),
    ("time_split", "Draft / verify time"),
    ("trees", "Token trees"),
    ("speedup", "Speed-up vs target"),
)


def stats_from_dict(data: dict) -> GenerationStats:
    """A GenerationStats from its to_dict() output; derived and unknown keys are ignored."""
    names = {f.name for f in fields(GenerationStats)}
    return GenerationStats(**{k: v for k, v in data.items() if k in names})


def as_stats(stats: GenerationStats | dict) -> GenerationStats:
    return stats if isinstance(stats, GenerationStats) else stats_from_dict(stats)


def describe_drafter(drafter: str) -> str:
    if drafter.startswith("model:"):
        return "draft model " + drafter.removeprefix("model:")
    return {
        "ngram": "n-gram lookup",
        "suffix": "suffix lookup",
        "head": "draft head",
        "none": "none (target alone)",
        "auto": "automatic (the fastest here, per reply)",
    }.get(drafter, drafter)


def drafter_in_use(stats: GenerationStats | dict) -> str:
    """The drafter that drafted most of a reply's rounds, in words ("none (target alone)" when every
    round was a plain step): what `auto` actually used."""
    stats = as_stats(stats)
    rounds = {name: count for name, count in stats.drafter_rounds.items() if name != "none"}
    if not rounds:  # no round of it drafted, or a backend that keeps no history of its rounds
        return describe_drafter(stats.drafter if stats.drafted and not stats.drafter_history else "none")
    return describe_drafter(max(rounds, key=rounds.__getitem__))


def tokens_per_second(stats: GenerationStats) -> float | None:
    """The one tok/s figure shown anywhere: generated tokens over decode time (prompt reading excluded)."""
    return stats.decode_tokens_per_s


def prompt_speed_text(stats: GenerationStats) -> str:
    """e.g. "prompt read at 1,234 tok/s": the prompt tokens this reply computed over the time they took
    (those an earlier turn left cached are not counted); "" when it read none, or none was timed."""
    speed = stats.prefill_tokens_per_s
    return "" if speed is None else f"prompt read at {speed:,.0f} tok/s"


def speedup_text(stats: GenerationStats) -> str:
    """The speed-up in the panel's words; the footer and the Markdown export say the same."""
    verdict = stats.verdict
    if verdict in SPEED_VERDICTS:
        if stats.speedup_is_estimate:
            return f"≈ ×{stats.speedup:.2f} ({verdict}, estimate)"
        return f"×{stats.speedup:.2f} ({verdict}, measured in this reply)"
    if verdict == "target alone" and stats.speedup is not None and not stats.speedup_is_estimate:
        return f"×{stats.speedup:.2f} (the target alone, its own baseline)"
    return {
        "target alone": "none (target alone)",
        "plain": "none: decoded plainly, nothing was drafted",
        "none accepted": "none: no draft token was accepted",
    }.get(verdict, "not estimated yet")


def format_stats(stats: GenerationStats) -> dict[str, str]:
    """The text for each of FIELDS' keys."""
    speculating = stats.drafter != "none" and not stats.fallback_to_plain
    drafted = stats.drafted > 0  # a reply that drafted nothing has no drafting figures
    values = {
        "drafter": describe_drafter(stats.drafter),
        "k": _k_text(stats) if speculating and drafted else DASH,
        "acceptance": _acceptance(stats),
        "mean_accepted": _number(stats.mean_accepted_length if drafted else None, "{:.2f} tokens/round"),
        "tokens_per_s": _number(tokens_per_second(stats), "{:.1f} tok/s"),
        "ttft": _number(stats.ttft_s, "{:.2f} s"),
        "prompt_speed": prompt_speed_text(stats) or DASH,
        "time_split": _time_split(stats) if drafted else DASH,
        "trees": _trees(stats),
        "speedup": speedup_text(stats),
    }
    unreported = set(stats.unreported)
    for key, names in SOURCES.items():
        if unreported.intersection(names):
            values[key] = UNREPORTED
    return values


def empty_stats(drafter: str | None) -> dict[str, str]:
    """What the panel shows before the first reply: the loaded drafter, and when the rest arrives."""
    values = dict.fromkeys((key for key, _ in FIELDS), WAITING)
    values["drafter"] = describe_drafter(drafter) if drafter else "no model loaded yet"
    return values


def notice(stats: GenerationStats) -> str:
    """The one notice for a reply: how drafting gave way to plain steps, said once and in agreement
    with the speed-up (GenerationStats.verdict), then any other note of the engine."""
    sentences = [part for part in _SENTENCE_END.split((stats.note or "").strip()) if part]
    if stats.fallback_to_plain:
        sentences = [part for part in sentences if not _FALLBACK_WORDS.search(part)]
    parts = []
    if stats.fallback_to_plain and stats.verdict == "plain":
        parts.append(PLAIN_NOTICE)
    elif stats.fallback_to_plain:
        parts.append(PARTLY_PLAIN_NOTICE.format(plain=stats.plain_steps, rounds=stats.rounds))
    if sentences:
        parts.append(" ".join(sentences))
    return "\n".join(parts)


def footer_line(stats: GenerationStats | dict) -> str:
    """The line under a reply: the same numbers as the panel, shorter."""
    stats = as_stats(stats)
    parts = []
    if stats.generated_tokens:
        parts.append(f"{stats.generated_tokens} tokens")
    speed = tokens_per_second(stats)
    if speed:
        parts.append(f"{speed:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"{stats.acceptance_rate:.0%} accepted")
    if stats.verdict in SPEED_VERDICTS:
        parts.append(speedup_text(stats).replace(" (", " vs target alone (", 1))
    elif stats.verdict == "plain":
        parts.append("decoded plainly")
    prompt_speed = prompt_speed_text(stats) if "prefill_time_s" not in stats.unreported else ""
    if prompt_speed and stats.prefill_tokens >= LONG_PROMPT_TOKENS:
        parts.append(prompt_speed)
    if stats.drafter:
        parts.append("automatic drafter" if stats.drafter == "auto" else describe_drafter(stats.drafter))
    return " · ".join(parts)


def footer_tooltip(stats: GenerationStats | dict) -> str:
    stats = as_stats(stats)
    values = format_stats(stats)
    rows = [(label, values[key]) for key, label in FIELDS]
    rows += [("Rounds", str(stats.rounds)), ("Prompt tokens", str(stats.prompt_tokens))]
    if stats.note or stats.fallback_to_plain:
        rows.append(("Note", notice(stats)))
    cells = "".join(f"<tr><td>{_escape(k)}</td><td>{_escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table><p>Click the reply to see its charts.</p>"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _k_text(stats: GenerationStats) -> str:
    if stats.current_k == 0:
        return f"0 ({stats.k_mode}: the last round drafted nothing)"
    return f"{stats.current_k} ({stats.k_mode})"


def _acceptance(stats: GenerationStats) -> str:
    rate = stats.acceptance_rate
    if rate is None:
        return DASH
    return f"{rate:.0%} ({stats.accepted} of {stats.drafted} drafted)"


def _trees(stats: GenerationStats) -> str:
    if not stats.tree_rounds:
        return DASH
    return f"{stats.tree_rounds} of {stats.rounds} rounds, {stats.off_chain_rounds} won by a side branch"


def _time_split(stats: GenerationStats) -> str:
    total = stats.draft_time_s + stats.verify_time_s
    if total <= 0:
        return DASH
    share = stats.draft_time_s / total
    return f"{stats.draft_time_s:.2f} s / {stats.verify_time_s:.2f} s ({share:.0%} drafting)"


def _number(value: float | None, template: str) -> str:
    return DASH if value is None else template.format(value)
