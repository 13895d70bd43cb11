"""Drafters behind one small interface (base.Drafter) and the capabilities some of them add, one module per drafter."""

from engine.decoding.drafters.base import (
    BeginsRequests,
    Cancelled,
    Draft,
    Drafter,
    KnowsItsAcceptance,
    Lookahead,
    LooksAhead,
    ProposesTrees,
    ReadsPrompt,
    ReadsTargetFeatures,
    StopsByConfidence,
    capability,
    common_prefix_length,
    empty_draft,
)
from engine.decoding.drafters.model import ModelDrafter, copy_acceptance_prior
from engine.decoding.drafters.ngram import NgramDrafter
from engine.decoding.drafters.suffix import SuffixDrafter

__all__ = [
    "BeginsRequests",
    "Cancelled",
    "Draft",
    "Drafter",
    "KnowsItsAcceptance",
    "LooksAhead",
    "Lookahead",
    "ModelDrafter",
    "NgramDrafter",
    "ProposesTrees",
    "ReadsPrompt",
    "ReadsTargetFeatures",
    "StopsByConfidence",
    "SuffixDrafter",
    "capability",
    "common_prefix_length",
    "copy_acceptance_prior",
    "empty_draft",
]
