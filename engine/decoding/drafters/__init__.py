"""Drafters behind one interface (base.Drafter), one module per drafter."""

from engine.decoding.drafters.base import Cancelled, Draft, Drafter, common_prefix_length, empty_draft
from engine.decoding.drafters.model import ModelDrafter
from engine.decoding.drafters.ngram import NgramDrafter
from engine.decoding.drafters.plain import NoDrafter

__all__ = [
    "Cancelled",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "NoDrafter",
    "common_prefix_length",
    "empty_draft",
]
