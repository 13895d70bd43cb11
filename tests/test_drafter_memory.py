"""What each drafter measured, kept between starts (engine.decoding.drafter_memory)."""

from __future__ import annotations

import json
import random

import pytest

from engine.decoding import drafter_memory
from engine.decoding.adaptive import ProbeSchedule
from engine.decoding.planner import planner_for
from engine.session import ChatEngine
from engine.settings import SamplingSettings, SpeculationSettings
from tests.test_adaptive import (
    TRUE_VERIFY,
    SyntheticDrafter,
    curve_of,
    geometric_outcome,
    simulated_round,
)


@pytest.fixture
def memory(monkeypatch, tmp_path):
    """Drafter memory on (the suite runs with it off), in a file of this test's own."""
    path = tmp_path / drafter_memory.FILE_NAME
    monkeypatch.delenv("TANDEM_DRAFTER_MEMORY", raising=False)
    monkeypatch.setattr(drafter_memory, "cache_path", lambda: path)
    return path


def drafters():
    """A head-like drafter, cheap and kept 35 % of the time, and a copy kept 95 % at a dearer step."""
    return [
        SyntheticDrafter("head", geometric_outcome(0.35), 0.05),
        SyntheticDrafter("model", geometric_outcome(0.95), 0.25),
    ]


def start(members, rounds: int, path, seed: int = 0) -> list[str]:
    """One start of the engine: a planner over `members`, recalling and then remembering what they
    measured; the drafter (and K) of each of its rounds."""
    rng = random.Random(seed)
    curve = curve_of(TRUE_VERIFY)
    planner = planner_for(members, SpeculationSettings(), curve)
    drafter_memory.recall(planner, "key", path=path)
    planner.start_reply()
    chosen = []
    for _ in range(rounds):
        plan = planner.plan([], limit=100)
        if plan.k == 0:
            chosen.append("none")
            planner.observe(plan, simulated_round(0, 0, 0.0, TRUE_VERIFY[1], 1))
            continue
        accepted = plan.drafter.outcome(rng, plan.k, None)
        draft_s = plan.k * plan.drafter.draft_step_s
        size = max(plan.verify_size, plan.k + 1)
        planner.observe(plan, simulated_round(plan.k, accepted, draft_s, curve.estimate(size), size))
        chosen.append(f"{plan.drafter.name}{plan.k}")
    drafter_memory.remember(planner, "key", path=path)
    return chosen


def test_a_second_start_begins_with_the_drafter_the_first_one_measured_best(tmp_path):
    path = tmp_path / drafter_memory.FILE_NAME
    first = start(drafters(), 40, path)
    assert first[:2] == ["head2", "model2"]  # nothing known: each member is probed first
    second = start(drafters(), 5, path)
    assert all(round.startswith("model") for round in second), second
    assert int(second[0].removeprefix("model")) > ProbeSchedule.PROBE_K  # no probe: K from what was measured
    fresh = start(drafters(), 5, tmp_path / "other.json")
    assert fresh[:2] == ["head2", "model2"]


def test_what_is_recalled_is_what_was_measured(tmp_path):
    path = tmp_path / drafter_memory.FILE_NAME
    members = drafters()
    start(members, 30, path)
    stored = json.loads(path.read_text())["key"]["drafters"]
    planner = planner_for(drafters(), SpeculationSettings(), curve_of(TRUE_VERIFY))
    assert drafter_memory.recall(planner, "key", path=path) == ["head", "model"]
    for drafter, controller in planner.members:
        assert drafter_memory.controller_memory(controller) == stored[drafter.name]
    assert drafter_memory.recall(planner, "another key", path=path) == []


def test_a_damaged_file_or_entry_is_learnt_again_without_an_error(tmp_path):
    path = tmp_path / drafter_memory.FILE_NAME
    start(drafters(), 20, path)
    data = json.loads(path.read_text())
    data["key"]["drafters"]["model"]["accepted"] = "many"
    path.write_text(json.dumps(data))
    planner = planner_for(drafters(), SpeculationSettings(), curve_of(TRUE_VERIFY))
    assert drafter_memory.recall(planner, "key", path=path) == ["head"]
    assert planner.members[1][1].draft_step_s is None  # the malformed one starts from nothing
    path.write_text("{not json")
    assert drafter_memory.recall(planner, "key", path=path) == []
    assert start(drafters(), 5, path)[:2] == ["head2", "model2"]
    assert set(json.loads(path.read_text())["key"]["drafters"]) == {"head", "model"}


def test_the_engine_remembers_its_drafters_and_a_new_one_recalls_them(memory, make_tiny, monkeypatch):
    target, draft = make_tiny(seed=0), make_tiny(seed=1, layers=1)
    speculation, sampling = SpeculationSettings(drafter="model"), SamplingSettings(max_new_tokens=24)
    recalled = []
    real_recall = drafter_memory.recall
    monkeypatch.setattr(
        drafter_memory, "recall", lambda *args, **kwargs: recalled.append(real_recall(*args, **kwargs))
    )
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    ChatEngine(target, draft, speculation, sampling, remember_drafters=True).generate_ids(prompt)
    assert recalled == [[]]  # a first start: nothing to recall
    entries = json.loads(memory.read_text())
    assert len(entries) == 1
    (entry,) = entries.values()
    assert set(entry["drafters"]) == {f"model:{draft.name}"}
    ChatEngine(target, draft, speculation, sampling, remember_drafters=True).generate_ids(prompt)
    assert recalled[-1] == [f"model:{draft.name}"]
    ChatEngine(target, draft, speculation, sampling).generate_ids(prompt)  # the bench's engines
    assert len(recalled) == 2


def test_turned_off_nothing_is_kept(memory, make_tiny, monkeypatch):
    monkeypatch.setenv("TANDEM_DRAFTER_MEMORY", "off")
    engine = ChatEngine(
        make_tiny(seed=0),
        make_tiny(seed=1, layers=1),
        SpeculationSettings(drafter="model"),
        SamplingSettings(max_new_tokens=8),
        remember_drafters=True,
    )
    engine.generate_ids([1, 2, 3, 4])
    assert not memory.exists()


def test_a_draft_step_recalled_from_a_busy_start_is_measured_again(tmp_path, monkeypatch):
    """A start that timed the copy while the machine was busy (its step as dear as a target step) saved
    that step. Recalled at face value, it priced the copy below the head for good: never chosen, it was
    never timed again, and every later start saved the same figure. A recalled step is measured again
    in the next start's first rounds."""

    def members(copy_step: float):
        return [
            SyntheticDrafter("head", geometric_outcome(0.5), 0.05),
            SyntheticDrafter("model", geometric_outcome(0.95), copy_step),
        ]

    def second_start(path) -> list[str]:
        start(members(copy_step=1.0), 40, path)  # busy
        return start(members(copy_step=0.25), 40, path)  # quiet

    second = second_start(tmp_path / "memory.json")
    assert any(round.startswith("model") for round in second[:3]), second
    assert sum(round.startswith("model") for round in second) >= 35, second
    monkeypatch.setattr(ProbeSchedule, "recalled", lambda self: None)
    monkeypatch.setattr(ProbeSchedule, "STALE_AFTER", 10**9)
    stale = second_start(tmp_path / "without.json")
    assert not any(round.startswith("model") for round in stale), stale
