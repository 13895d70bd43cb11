"""Drafters behind one interface (base.Drafter), one module per drafter."""

from engine.decoding.drafters.auto import AutoDrafter
from engine.decoding.drafters.base import (
    Cancelled,
    Draft,
    Drafter,
    Lookahead,
    common_prefix_length,
    empty_draft,
)
from engine.decoding.drafters.model import ModelDrafter, copy_acceptance_prior
from engine.decoding.drafters.ngram import NgramDrafter
from engine.decoding.drafters.plain import NoDrafter
from engine.decoding.drafters.suffix import SuffixDrafter

__all__ = [
    "AutoDrafter",
    "Cancelled",
    "Draft",
    "Drafter",
    "Lookahead",
    "ModelDrafter",
    "NgramDrafter",
    "NoDrafter",
    "SuffixDrafter",
    "common_prefix_length",
    "copy_acceptance_prior",
    "empty_draft",
]
