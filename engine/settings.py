"""Settings that shape one generation. Validated here, so every caller gets the same messages."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from engine.errors import SettingsError

MAX_K = 16
# A seed is a signed 64-bit integer: torch's generators take it whole (with room for the draft's
# seed + 1), and what is wider is refused rather than silently folded onto another seed.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
DrafterKind = Literal["auto", "model", "ngram", "suffix", "head", "none"]
# Each drafter setting, and whether it loads a draft model beside the target ("auto" may choose one
# among its drafters); engine.drafter_registry maps the same names to how their drafters are made.
NEEDS_DRAFT_MODEL: dict[str, bool] = {
    "auto": True,
    "model": True,
    "ngram": False,
    "suffix": False,
    "head": False,
    "none": False,
}
DRAFTER_KINDS = tuple(NEEDS_DRAFT_MODEL)
NO_DRAFT = "none"  # the draft model spec that loads none (engine.models.pair.load_pair)


def needs_draft_model(drafter: str) -> bool:
    """Whether the drafter setting loads a draft model (False for an unknown name)."""
    return NEEDS_DRAFT_MODEL.get(drafter, False)


# Tokens the target's KV cache holds (prompt and reply together) unless the user chooses another
# context; never more than the model's own. The cache is allocated at this size when the model loads.
DEFAULT_CONTEXT_TOKENS = 8192
MIN_CONTEXT_TOKENS = 256
# 128 GiB of float16 cache for an 8B Llama shape: more than any machine Tandem runs on holds
MAX_CONTEXT_TOKENS = 1_048_576
UNNAMED_CONTEXT_TOKENS = 2048  # for model configs that do not name their context length


def check_context(tokens: int | None) -> None:
    """SettingsError unless `tokens` is None (the default context) or a context the cache can hold."""
    if tokens is not None and tokens < MIN_CONTEXT_TOKENS:
        raise SettingsError(f"The context must be at least {MIN_CONTEXT_TOKENS} tokens, not {tokens}.")
    if tokens is not None and tokens > MAX_CONTEXT_TOKENS:
        raise SettingsError(f"The context must be at most {MAX_CONTEXT_TOKENS:,} tokens, not {tokens:,}.")


def context_length_of(config) -> int:
    """The context a model's config declares, or UNNAMED_CONTEXT_TOKENS where it names none."""
    return int(getattr(config, "max_position_embeddings", None) or UNNAMED_CONTEXT_TOKENS)


def cache_tokens_for(config, context: int | None = None) -> int:
    """Tokens of static KV buffer for a model: the context chosen (`context`, by default
    DEFAULT_CONTEXT_TOKENS), never more than the model's own context."""
    check_context(context)
    return min(context_length_of(config), context or DEFAULT_CONTEXT_TOKENS)


@dataclass
class SamplingSettings:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()  # the reply ends before the first of these strings

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        # NaN compares false with everything, so each range check is written to fail for it.
        if not 0 <= self.temperature <= 5:
            raise SettingsError(f"Temperature must be between 0 and 5, not {self.temperature}.")
        if self.top_k < 0:
            raise SettingsError(f"top-k must be 0 (off) or positive, not {self.top_k}.")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise SettingsError(f"top-p must be in (0, 1], not {self.top_p}.")
        if self.max_new_tokens < 1:
            raise SettingsError(f"Max new tokens must be at least 1, not {self.max_new_tokens}.")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise SettingsError(
                f"The seed must be a whole number from {SEED_MIN} to {SEED_MAX} (64 bits), not {self.seed}."
            )


@dataclass
class SpeculationSettings:
    drafter: DrafterKind = "model"
    k: int | None = None  # None: adaptive
    max_k: int = 8
    p_min: float = 0.0  # stop drafting when the draft's top probability falls below this
    # Suffix lengths the n-gram drafter matches. Single-token matches propose mostly wrong tokens
    # (measured on the built-in prompt set: 22 % of drafted tokens accepted at K=4 with min 1, 38 %
    # with min 2, for nearly the same tokens per round), and wrong tokens still cost verify time.
    ngram_max: int = 4
    ngram_min: int = 2
    # verify a drafter's other candidates in the same forward where the measured cost allows
    # (engine.decoding.tree); runners without tree attention verify chains
    trees: bool = True

    @property
    def adaptive(self) -> bool:
        return self.k is None

    def validate(self) -> None:
        if self.drafter not in DRAFTER_KINDS:
            raise SettingsError(f"Unknown drafter '{self.drafter}': choose {', '.join(DRAFTER_KINDS)}.")
        if self.k is not None and not 1 <= self.k <= MAX_K:
            raise SettingsError(f"K must be between 1 and {MAX_K}, not {self.k}.")
        if not 1 <= self.max_k <= MAX_K:
            raise SettingsError(f"Max K must be between 1 and {MAX_K}, not {self.max_k}.")
        if not 0 <= self.p_min < 1:  # false for NaN too
            raise SettingsError(f"p_min must be in [0, 1), not {self.p_min}.")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise SettingsError("n-gram sizes must satisfy 1 <= min <= max.")

    def to_dict(self) -> dict:
        return asdict(self)
