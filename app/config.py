"""The app's settings: one plain dataclass, persisted as JSON in the store, mapped onto engine settings.

No Qt here, so the mapping and validation are tested without a window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine import settings as engine_settings
from engine.errors import SettingsError, TandemError
from engine.models.builtin import DEFAULT_TARGET
from engine.models.quantize import DRAFT_QUANTIZATIONS, PRECISIONS
from engine.settings import (
    DEFAULT_CONTEXT_TOKENS,
    MAX_K,
    SamplingSettings,
    SpeculationSettings,
    check_context,
    needs_draft_model,
)

STORE_KEY = "app_config"
WORKING_KEY = "app_config_working"  # the last config whose models loaded

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DRAFTERS = engine_settings.DRAFTER_KINDS
# "auto" measures the drafters on this machine and keeps the fastest, so it is the default.
DEFAULT_DRAFTER = "auto"
BACKENDS = ("local", "server")
# the target's precision, whose output Tandem reproduces exactly; "default": the device's usual dtype
TARGET_PRECISIONS = ("default", *PRECISIONS)
QUANTIZATIONS = DRAFT_QUANTIZATIONS
K_MODES = ("adaptive", "fixed")
COMPILED = ("auto", "on", "off")  # auto: CUDA at load, CPU in the background; on: at load everywhere

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Fields whose change means loading a different target model (or its KV cache at another size).
_TARGET_FIELDS = ("target", "device", "dtype", "compiled", "target_precision", "context")
# Every field that says which models are loaded and where.
MODEL_FIELDS = (*_TARGET_FIELDS, "draft", "draft_quantization", "draft_on_cpu", "backend", "server_url")


@dataclass
class AppConfig:
    target: str = DEFAULT_TARGET
    device: str = "auto"
    dtype: str = "auto"
    drafter: str = DEFAULT_DRAFTER
    # The target's own spec means "a quantized copy": a draft for a float target (GPU, --precision);
    # a GGUF target on a CPU runs in its own blocks, and no copy of it is loaded.
    draft: str = DEFAULT_TARGET
    draft_quantization: str = "auto"
    draft_on_cpu: bool = False
    k_mode: str = "adaptive"
    k: int = 4  # used when k_mode is "fixed"
    max_k: int = 8
    p_min: float = 0.0
    trees: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    seed: int | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    compiled: str = "auto"
    stop_strings: str = ""  # one per line
    backend: str = "local"  # "local": the models on this computer; "server": an OpenAI-compatible server
    server_url: str = ""  # its API key is kept by the credentials store, never here
    target_precision: str = "default"
    auto_titles: bool = True  # the model titles a conversation after its first exchange (app/titles.py)
    # tokens a conversation may hold, prompt and reply together: the KV cache is allocated at this size
    # when the models load, never more than the target's own context (engine.settings.cache_tokens_for)
    context: int = DEFAULT_CONTEXT_TOKENS

    # --- engine settings ---------------------------------------------------------------------------

    def speculation(self) -> SpeculationSettings:
        k = self.k if self.k_mode == "fixed" else None
        return SpeculationSettings(
            drafter=self.drafter, k=k, max_k=self.max_k, p_min=self.p_min, trees=self.trees
        )

    def sampling(self) -> SamplingSettings:
        extra = {"stop": self.stops()} if "stop" in {f.name for f in fields(SamplingSettings)} else {}
        return SamplingSettings(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            **extra,
        )

    def stops(self) -> tuple[str, ...]:
        return tuple(line for line in self.stop_strings.splitlines() if line)

    def validate(self) -> None:
        """Raise SettingsError with a message the user can act on; engine ranges give engine messages."""
        _choice("Device", self.device, DEVICES)
        _choice("Data type", self.dtype, DTYPES)
        _choice("Draft quantization", self.draft_quantization, QUANTIZATIONS)
        _choice("K mode", self.k_mode, K_MODES)
        _choice("Compilation", self.compiled, COMPILED)
        _choice("Backend", self.backend, BACKENDS)
        _choice("Target precision", self.target_precision, TARGET_PRECISIONS)
        check_context(self.context)
        if self.backend == "server":
            url = self.server_url.strip()
            if not url.startswith(("http://", "https://")) or len(url) < 10:
                raise SettingsError("Enter the server's URL, starting with http:// or https://.")
        if not self.target.strip():
            raise SettingsError("Choose a target model.")
        if needs_draft_model(self.drafter) and not self.draft.strip():
            raise SettingsError("Choose a draft model, or pick the n-gram drafter or none.")
        self.speculation().validate()
        # K is kept while adaptive so switching back to fixed restores it; it must stay in range either way.
        SpeculationSettings(k=self.k).validate()
        self.sampling().validate()

    # --- reload decisions --------------------------------------------------------------------------

    def target_changed(self, other: AppConfig) -> bool:
        return any(getattr(self, name) != getattr(other, name) for name in _TARGET_FIELDS)

    def draft_changed(self, other: AppConfig) -> bool:
        return self._draft_identity() != other._draft_identity()

    def needs_load(self, loaded: AppConfig | None) -> bool:
        """Whether the engine loaded for `loaded` (None: no engine) cannot serve self: another target
        (or context), backend or draft model. Drafter, K, trees, sampling and stop strings reach the engine at its
        next reply without a load (ChatEngine reads them at every call); a drafter that needs no model
        keeps the loaded draft, so switching back costs nothing either."""
        if loaded is None:
            return True
        if (self.backend, self.server_url) != (loaded.backend, loaded.server_url) or self.target_changed(
            loaded
        ):
            return True
        if self.backend != "local" or not needs_draft_model(self.drafter):
            return False
        return self.draft_changed(loaded)

    def with_models_of(self, other: AppConfig) -> AppConfig:
        """self with other's models (target, draft, device, backend), its other choices kept."""
        return dataclasses.replace(self, **{name: getattr(other, name) for name in MODEL_FIELDS})

    def _draft_identity(self) -> tuple | None:
        if not needs_draft_model(self.drafter):
            return None
        return (self.draft, self.draft_quantization, self.draft_on_cpu)

    # --- persistence -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AppConfig:
        """Unknown keys are ignored, missing ones default, and a value of the wrong type falls back."""
        config = cls()
        if not isinstance(data, dict):
            return config
        for f in fields(cls):
            if f.name in data:
                value = _coerce(data[f.name], getattr(config, f.name))
                if value is not _INVALID:
                    setattr(config, f.name, value)
        return config

    @classmethod
    def load(cls, store) -> AppConfig:
        """The stored config; a stored value that no longer validates reverts to its default alone."""
        stored = cls.from_dict(store.get_setting(STORE_KEY))
        try:
            stored.validate()
            return stored
        except SettingsError:
            pass
        config = cls()
        for f in fields(cls):
            candidate = dataclasses.replace(config, **{f.name: getattr(stored, f.name)})
            try:
                candidate.validate()
            except SettingsError:
                continue
            config = candidate
        return config

    def save(self, store) -> None:
        store.set_setting(STORE_KEY, self.to_dict())

    def save_working(self, store) -> None:
        """Remember this config as one whose models loaded: the fallback for a later bad choice."""
        store.set_setting(WORKING_KEY, self.to_dict())

    @classmethod
    def load_working(cls, store) -> AppConfig | None:
        data = store.get_setting(WORKING_KEY)
        if not isinstance(data, dict):
            return None
        config = cls.from_dict(data)
        try:
            config.validate()
        except SettingsError:
            return None
        return config

    @classmethod
    def load_for_start(cls, store, check_models=None) -> tuple[AppConfig, str]:
        """(config to start with, message for the user or '').

        The saved config, unless `check_models(config)` (which raises TandemError) refuses its models:
        then the last config that loaded, or the defaults, with a message that says what happened.
        """
        config = cls.load(store)
        if check_models is None:
            return config, ""
        try:
            check_models(config)
            return config, ""
        except TandemError as exc:
            problem = str(exc)
        fallback = cls.load_working(store)
        if fallback is None or fallback == config:
            fallback = dataclasses.replace(cls(), **{f: getattr(config, f) for f in _KEPT_ON_FALLBACK})
        fallback.save(store)
        return fallback, (
            f"The saved models could not be used: {problem}\n\nTandem starts with {fallback.target} instead; "
            "open Settings (Ctrl+,) to choose again."
        )


_INVALID = object()
# what a fallback to the defaults keeps of a config whose models cannot load
_KEPT_ON_FALLBACK = (
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "seed",
    "system_prompt",
    "stop_strings",
)


def _coerce(value: Any, default: Any) -> Any:
    """value converted to the type of the field's default, or _INVALID."""
    if default is None:  # seed: int or None
        if value is None:
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if isinstance(default, bool):
        return value if isinstance(value, bool) else _INVALID
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _INVALID
    if isinstance(default, str):
        return value if isinstance(value, str) else _INVALID
    return _INVALID


def _choice(label: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"{label} must be one of {', '.join(choices)}, not '{value}'.")


__all__ = ["AppConfig", "MAX_K", "STORE_KEY", "DEVICES", "DTYPES", "DRAFTERS", "QUANTIZATIONS", "K_MODES"]
