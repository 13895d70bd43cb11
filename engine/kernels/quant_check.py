"""Check a quantized model against its float original before it is used, and remember the answer.

The probes are a few hundred tokens of plain and chat-formatted text. The check runs both models
over each probe in one forward and compares the next-token choices (top-1 agreement) and the
logits (max absolute error, and the same error relative to the spread of the float logits).
Results are cached per model fingerprint, kernel, torch version and CPU features, in a small JSON
file under the cache folder, so a machine pays for the check once.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.paths import cache_dir

# A kernel passes when its top-1 choice agrees with the float model on at least this share of
# positions. A healthy INT8 kernel agrees on ~0.95 of positions here and INT4 on ~0.85; the broken
# dynamic INT8 path this check exists for agrees on under 0.3.
MIN_AGREEMENT = {"int8": 0.85, "int4": 0.70}
CACHE_VERSION = 1

PROBES = (
    "The capital of France is Paris. The capital of Italy is Rome, and the longest river in Africa "
    "is the Nile. Water boils at 100 degrees Celsius at sea level.",
    "Here is a simple recipe for pancakes: mix one cup of flour, one egg, a cup of milk and a pinch "
    "of salt, then cook spoonfuls in a hot pan until golden on both sides.",
)
CHAT_PROBE = (
    "Can you explain in two sentences why the sky is blue?",
    "Sunlight is scattered by the molecules in the air, and blue light is scattered much more than "
    "red light because of its shorter wavelength. So when we look at the sky, blue reaches our eyes "
    "from every direction.",
)


@dataclass
class CheckResult:
    agreement: float  # share of probe positions where the top-1 tokens agree
    max_logit_error: float  # max |logit difference| over all positions and vocabulary
    relative_error: float  # max_logit_error / (max - min of the float logits)
    tokens: int  # probe positions compared
    passed: bool
    seconds: float

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def probe_inputs(tokenizer, device) -> list[torch.Tensor]:
    """Token ids of the plain probes and one chat-formatted exchange: [n] each."""
    texts = list(PROBES)
    template = getattr(tokenizer, "chat_template", None)
    if template:
        user, assistant = CHAT_PROBE
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
    else:
        texts.append(" ".join(CHAT_PROBE))
    return [torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long, device=device) for text in texts]


def reference_run(model, probes: list[torch.Tensor]):
    """The float model over the probes: (input maxima of its linear layers, for smoothing; logits)."""
    from engine.kernels.quant_smoothing import input_channel_maxima

    return input_channel_maxima(model, probes)


@torch.inference_mode()
def probe_logits(model, probes: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(input_ids=ids.view(1, -1), use_cache=False).logits[0].float() for ids in probes]


@torch.inference_mode()
def check_against(reference: list[torch.Tensor], model, probes: list[torch.Tensor], mode: str) -> CheckResult:
    """Compare `model` with the float logits `reference` (from probe_logits) on the same probes."""
    started = time.perf_counter()
    agree = total = 0
    max_error = spread = 0.0
    for expected, ids in zip(reference, probe_logits(model, probes), strict=True):
        width = min(expected.size(-1), ids.size(-1))
        expected, got = expected[:, :width], ids[:, :width]  # [n, V]
        agree += int((expected.argmax(-1) == got.argmax(-1)).sum())
        total += expected.size(0)
        max_error = max(max_error, float((expected - got).abs().max()))
        spread = max(spread, float(expected.max() - expected.min()))
    agreement = agree / max(total, 1)
    relative = max_error / spread if spread > 0 else float("inf")
    passed = agreement >= MIN_AGREEMENT[mode] and relative < 0.5
    return CheckResult(agreement, max_error, relative, total, passed, time.perf_counter() - started)


# ---- cache -----------------------------------------------------------------------------------


def model_fingerprint(folder: Path | None, config=None) -> str:
    """A cheap identity for a model's weights: its files' names, sizes and mtimes (or its config)."""
    parts: list[str] = []
    if folder is not None and Path(folder).is_dir():
        for path in sorted(Path(folder).glob("*.safetensors")) + [Path(folder) / "config.json"]:
            if path.is_file():
                stat = path.stat()
                parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    elif config is not None:
        parts.append(json.dumps(config.to_dict(), sort_keys=True, default=str))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def machine_key(kernel_name: str, kernel_version: int, fingerprint: str) -> str:
    from engine.kernels.cpu_features import cpu_signature

    on_gpu = torch.cuda.is_available() and (kernel_name.endswith("cuda") or kernel_name == "int8-bnb")
    device = torch.cuda.get_device_name() if on_gpu else ""
    raw = f"{CACHE_VERSION}|{fingerprint}|{kernel_name}|{kernel_version}|{torch.__version__}|{cpu_signature()}|{device}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cache_path() -> Path:
    return cache_dir() / "quant-checks.json"


def read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache_entry(key: str, entry: dict) -> None:
    """Add one entry to the cache file atomically (write a temp file, then rename)."""
    data = read_cache()
    data[key] = entry
    path = cache_path()
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # a read-only cache only costs a re-check next time
