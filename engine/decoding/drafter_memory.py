"""What each drafter measured, kept between starts: a new start's first reply begins from it.

Adaptive K and `auto` learn each drafter as they go: its acceptance per draft position, its draft
step, and for a draft head what each confidence is worth. A fresh start knew none of it, and paid in
its first reply: on the built-in model, `auto`'s first reply let the draft head, whose first two
rounds happened to be kept, draft its next nine rounds (kept 40 % of the time) before the quantized
copy (kept 96 %) took over; later replies drafted with the copy from their first round.

Recalled figures are a prior, never a certainty: each reply holds earlier counts at
KController.REPLY_MEMORY of their weight and drops them when its own rounds contradict them
(AcceptanceModel.start_reply), and a recalled draft step counts as stale: the drafter gets a round to
time it again when only that step keeps it from being chosen (ProbeSchedule.STALE_AFTER).

One JSON file in the cache dir maps a key (the machine, the target, its draft models) to
{drafter name: memory}. Writes are atomic; a file that cannot be read is empty, so a damaged file
costs one reply's learning. TANDEM_DRAFTER_MEMORY=off starts every run from nothing (the test
suite does, so that no test learns from another).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from engine.decoding.adaptive import KController
from engine.decoding.planner import DraftPlanner
from engine.paths import cache_dir
from engine.runtime.calibration import machine_key, read_json, write_json

FILE_NAME = "drafters.json"
VERSION = 1  # bump when what is kept changes meaning
MAX_KEYS = 64  # machines x models x draft choices kept in the file; the oldest go first


def enabled() -> bool:
    return os.environ.get("TANDEM_DRAFTER_MEMORY", "").lower() != "off"


def memory_key(target, draft=None, head: str = "") -> str:
    """The machine, the target and the draft models (LoadedModels; `head` names the draft head)."""

    def model(loaded) -> list | None:
        return (
            None
            if loaded is None
            else [loaded.spec, loaded.quantization, str(loaded.dtype), loaded.info.get("kernel")]
        )

    key = {
        "version": VERSION,
        "machine": machine_key(target.device),
        "target": model(target),
        "draft": model(draft),
        "head": head,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def cache_path() -> Path:
    return cache_dir() / FILE_NAME


def controller_memory(controller: KController) -> dict:
    fastest = controller.fastest_draft_step_s
    return {
        **controller.acceptance.counts(),
        "draft_step_s": controller.draft_step_s,
        "fastest_draft_step_s": fastest if math.isfinite(fastest) else None,
        "empty_share": controller.empty_share,
        "confidence_kept": list(controller.calibration.kept),
        "confidence_decided": list(controller.calibration.decided),
    }


def recall_controller(controller: KController, memory: dict) -> None:
    """Raises (KeyError, TypeError, ValueError) on a malformed memory, leaving the controller as it was."""
    accepted, decided = [float(a) for a in memory["accepted"]], [float(d) for d in memory["decided"]]
    step, fastest = _seconds(memory.get("draft_step_s")), _seconds(memory.get("fastest_draft_step_s"))
    kept = [float(k) for k in memory["confidence_kept"]]
    confidence_decided = [float(d) for d in memory["confidence_decided"]]
    if len(kept) != len(controller.calibration.kept) or len(confidence_decided) != len(kept):
        raise ValueError("confidence bins differ")
    controller.acceptance.set_counts(accepted, decided)
    if step is not None:
        controller.draft_step_s = step
        controller.schedule.recalled()
    if fastest is not None:
        controller.fastest_draft_step_s = fastest
        controller.draft_steps_seen = max(controller.draft_steps_seen, 2)
    controller.empty_share = min(1.0, max(0.0, float(memory.get("empty_share", 0.0))))
    controller.calibration.kept, controller.calibration.decided = kept, confidence_decided


def _seconds(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def recall(
    planner: DraftPlanner, key: str, only: set[str] | None = None, path: Path | None = None
) -> list[str]:
    """Gives each of the planner's drafters (those named in `only`, when given) what an earlier start
    measured of it; returns the names recalled."""
    stored = read_json(path or cache_path()).get(key)
    if not isinstance(stored, dict) or not isinstance(stored.get("drafters"), dict):
        return []
    recalled = []
    for drafter, controller in planner.members:
        if only is not None and drafter.name not in only:
            continue
        memory = stored["drafters"].get(drafter.name)
        if not isinstance(memory, dict):
            continue
        try:
            recall_controller(controller, memory)
        except (KeyError, TypeError, ValueError):
            continue
        recalled.append(drafter.name)
    return recalled


def remember(planner: DraftPlanner, key: str, path: Path | None = None) -> None:
    """Stores what the planner's drafters measured under `key`, keeping other keys' entries and the
    drafters this planner does not hold. Never raises for a read-only cache."""
    path = path or cache_path()
    data = read_json(path)
    entry = data.pop(key, None)
    drafters = entry.get("drafters") if isinstance(entry, dict) else None
    drafters = drafters if isinstance(drafters, dict) else {}
    for drafter, controller in planner.members:
        if controller.draft_step_s is not None:  # measured at least once
            drafters[drafter.name] = controller_memory(controller)
    data[key] = {"drafters": drafters}  # last, so the oldest keys are the first ones
    while len(data) > MAX_KEYS:
        data.pop(next(iter(data)))
    write_json(path, data)  # on failure the next start learns again
