"""Which drafters a reply drafts with. Each drafter setting (SpeculationSettings.drafter, one of
engine.settings.DRAFTER_KINDS) maps to how its drafters are made, as llama.cpp's speculative types
map from their names. The drafters themselves belong to the engine (a `DrafterSource`), which keeps
them across turns so that what was measured of them stays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.decoding.drafters import Drafter
from engine.settings import SpeculationSettings

PLAIN = "none"  # the drafter setting that drafts nothing


@dataclass(frozen=True)
class DrafterChoice:
    """What a drafter setting gives a reply: the planner's name for it, who may draft (none: plain
    decoding) and what the user should know about it."""

    name: str
    drafters: list[Drafter]
    note: str = ""

    @classmethod
    def of(cls, drafter: Drafter, note: str = "") -> DrafterChoice:
        return cls(drafter.name, [drafter], note)


class DrafterSource(Protocol):
    """The drafters an engine keeps (ChatEngine)."""

    extra_drafters: list[Drafter]  # more drafters for `auto` to choose among

    def ngram_drafter(self, speculation: SpeculationSettings) -> Drafter:
        """Prompt lookup at the settings' n-gram sizes."""
        ...

    def suffix_drafter(self) -> Drafter:
        """The suffix index over this conversation and earlier ones."""
        ...

    def model_drafter(self) -> Drafter | None:
        """The draft model's drafter; None when no draft model is loaded."""
        ...

    def head_drafter(self) -> Drafter:
        """The draft head (IncompatibleDraftError when none fits the target)."""
        ...

    def fitting_head(self) -> Drafter | None:
        """The draft head where one fits the target; else None."""
        ...


def _plain(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    return DrafterChoice(PLAIN, [])


def _ngram(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    return DrafterChoice.of(source.ngram_drafter(speculation))


def _suffix(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    return DrafterChoice.of(source.suffix_drafter())


def _model(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    drafter = source.model_drafter()
    if drafter is None:
        note = "No draft model is loaded, so drafting uses n-gram lookup."
        return DrafterChoice.of(source.ngram_drafter(speculation), note)
    return DrafterChoice.of(drafter)


def _head(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    return DrafterChoice.of(source.head_drafter())


def _auto(source: DrafterSource, speculation: SpeculationSettings) -> DrafterChoice:
    members = [source.ngram_drafter(speculation), source.suffix_drafter(), *source.extra_drafters]
    members += [d for d in (source.fitting_head(), source.model_drafter()) if d is not None]
    return DrafterChoice("auto", members)


DRAFTERS: dict[str, Callable[[DrafterSource, SpeculationSettings], DrafterChoice]] = {
    PLAIN: _plain,
    "ngram": _ngram,
    "suffix": _suffix,
    "model": _model,
    "head": _head,
    "auto": _auto,
}


def choose(source: DrafterSource, speculation: SpeculationSettings, no_drafting: str = "") -> DrafterChoice:
    """The drafters of the setting speculation.drafter; none, with `no_drafting` as the note, where
    that says why nothing drafts for this target."""
    if speculation.drafter != PLAIN and no_drafting:
        return DrafterChoice(PLAIN, [], no_drafting)
    return DRAFTERS[speculation.drafter](source, speculation)
