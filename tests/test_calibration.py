"""The verify-cost calibration runs before the first reply, shows as a state, and is kept per machine and model."""

from __future__ import annotations

import json
import time

import pytest

from engine.runtime import calibration
from engine.session import ChatEngine
from engine.settings import SamplingSettings


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setattr(calibration, "cache_path", lambda: path)
    return path


@pytest.fixture
def restart_tolerates_load(monkeypatch):
    """A restart's quick check compares forwards of a millisecond; on a shared host another program's
    load bends their ratio past the product's tolerance and the restart rightly measures again. These
    tests are about reading back, so they widen it; test_the_start_up_check_judges_two_token_verifies_too
    tests the tolerance itself."""
    monkeypatch.setattr(calibration, "STORED_SHAPE_TOLERANCE", 4.0)
    monkeypatch.setattr(calibration, "SHAPE_JITTER_S", 0.004)


def stages_of(engine: ChatEngine) -> list[str]:
    stages = []
    engine.prepare(lambda stage, done, total: stages.append(stage))
    return stages


def test_prepare_measures_once_and_a_second_start_reads_it_back(cache_file, target, restart_tolerates_load):
    first = ChatEngine(target)
    assert stages_of(first) == ["Measuring this machine"]
    assert cache_file.is_file()
    stored = json.loads(cache_file.read_text())
    assert len(stored) == 1

    second = ChatEngine(target)  # a restart: a new engine on the same machine and model
    assert stages_of(second) == []
    first_curve, second_curve = first._verify_curve.seconds, second._verify_curve.seconds
    scale = second_curve[1] / first_curve[1]  # 1, unless the quick check found the machine changed
    assert second_curve == pytest.approx({n: t * scale for n, t in first_curve.items()})


def test_a_curve_stored_while_the_machine_was_busy_is_rescaled_at_the_next_start(
    cache_file, target, monkeypatch
):
    """A curve measured under heavy load would make every speed-up estimate wrong (the target alone
    looked 10x slower than it is); one quick single-step check at start rescales it. The check's
    timings are the test's (the machine as fast as when the curve was first measured), so the
    machine running the tests may be as busy as it likes."""
    ChatEngine(target).prepare()
    key, entry = next(iter(json.loads(cache_file.read_text()).items()))
    quiet = {int(n): t for n, t in entry["seconds"].items()}
    busy = {n: t * 20 for n, t in quiet.items()}
    calibration.save(key, busy, cache_file)
    engine = ChatEngine(target)
    checks = []

    def measure_now(runner, sizes, repeats=3):
        checks.append(tuple(sizes))
        return {n: quiet[n] for n in sizes}

    monkeypatch.setattr(calibration, "time_forwards", measure_now)
    assert stages_of(engine) == []  # still no full measurement
    assert checks == [calibration.CHECK_SIZES]  # one quick check
    assert engine.calibrate() == pytest.approx(quiet[1])
    assert calibration.load(key, cache_file) == pytest.approx(quiet)  # and the corrected curve is kept


def test_the_first_reply_does_not_calibrate_after_prepare(cache_file, target, monkeypatch):
    engine = ChatEngine(target, sampling=SamplingSettings(max_new_tokens=3))
    engine.prepare()
    measured = []
    monkeypatch.setattr(calibration, "save", lambda *args, **kwargs: measured.append(args))
    engine.generate_ids([5, 6, 7])
    assert measured == []


def test_the_key_follows_precision_and_quantization(target):
    from engine.runtime.eager import ModelRunner

    runner = ModelRunner(target.model, target.device)
    key = calibration.calibration_key(target, runner)
    assert calibration.calibration_key(target, runner) == key
    import dataclasses

    import torch

    assert calibration.calibration_key(dataclasses.replace(target, dtype=torch.bfloat16), runner) != key
    assert calibration.calibration_key(dataclasses.replace(target, quantization="int8"), runner) != key


def test_stale_damaged_or_empty_entries_are_measured_again(tmp_path):
    path = tmp_path / "calibration.json"
    calibration.save("k", {1: 0.01, 2: 0.015}, path)
    assert calibration.load("k", path) == {1: 0.01, 2: 0.015}
    assert calibration.load("k", path, now=time.time() + calibration.MAX_AGE_S + 1) is None
    assert calibration.load("other", path) is None
    path.write_text("{not json")
    assert calibration.load("k", path) is None
    calibration.save("k", {1: 0.0}, path)  # a zero step time is not a measurement
    assert calibration.load("k", path) is None


def test_a_slow_measurement_on_a_busy_machine_is_bounded_before_it_is_kept(tmp_path):
    path = tmp_path / "calibration.json"
    measured = {1: 3.5, 2: 0.2, 4: 0.48, 8: 0.3}  # as measured at load average 14 on two cores
    calibration.save("k", measured, path)
    assert measured == {1: 0.2, 2: 0.2, 4: 0.3, 8: 0.3}  # the engine uses what is kept
    assert calibration.load("k", path) == measured


def test_a_stored_curve_of_the_wrong_shape_is_measured_again(cache_file, target, monkeypatch):
    """A curve whose verify sizes were stored far off their cost (seen: t(4) = t(1), when a forward over
    4 tokens costs 1.45 single steps) made adaptive K misjudge every round of a session. The start-up
    check compares t(4) / t(1) too, and measures the whole curve again when it is off (on a machine
    quiet enough for a measurement to be trusted: here, whatever the load of the host). The timings the
    engines measure after the first are the test's (the first curve again), so load cannot bend them."""
    monkeypatch.setattr(calibration, "BUSY_OTHERS_CORES", float("inf"))
    ChatEngine(target).prepare()
    key, entry = next(iter(json.loads(cache_file.read_text()).items()))
    measured = {int(n): t for n, t in entry["seconds"].items()}
    dear = {n: t if n == 1 else 30 * measured[1] + 0.02 + t for n, t in measured.items()}
    calibration.save(key, dear, cache_file)

    def engine_measuring_the_first_curve() -> ChatEngine:
        engine = ChatEngine(target)
        monkeypatch.setattr(
            calibration, "time_forwards", lambda runner, sizes, repeats=3: {n: measured[n] for n in sizes}
        )
        return engine

    assert stages_of(engine_measuring_the_first_curve()) == ["Measuring this machine"]
    assert calibration.load(key, cache_file) == pytest.approx(measured)
    assert stages_of(engine_measuring_the_first_curve()) == []  # the new curve passes the check


def test_the_start_up_check_judges_two_token_verifies_too():
    """Seen on a 2-core CPU: a curve stored under load held t(2) = 1.07 single steps; quiet, a two-token
    verify cost 1.39, and the draft head, which mostly drafts one token, drafted rounds that lost."""
    stored = {1: 0.0189, 2: 0.0203, 4: 0.0245}
    assert calibration.shape_agrees(stored, {1: 0.0151, 2: 0.0162, 4: 0.0196})  # the same shape, faster
    assert not calibration.shape_agrees(stored, {1: 0.0151, 2: 0.0210, 4: 0.0196})  # t(2) now dear
    assert not calibration.shape_agrees(stored, {1: 0.0151, 2: 0.0162, 4: 0.0255})  # t(4) now dear
    small = {1: 0.0010, 2: 0.0011, 4: 0.0012}  # a small model: a millisecond of jitter is no shape
    assert calibration.shape_agrees(small, {1: 0.0010, 2: 0.0016, 4: 0.0012})


def test_a_shape_that_disagrees_on_a_busy_machine_keeps_the_stored_curve(
    cache_file, target, restart_tolerates_load, monkeypatch
):
    """Measuring again under the load that bent the quick check stores no better a curve, and a restart
    under load spent half a minute on it before its first answer: the stored curve is kept, rescaled."""
    monkeypatch.setattr(calibration, "BUSY_OTHERS_CORES", -1.0)  # any load at all counts as busy
    ChatEngine(target).prepare()
    key, entry = next(iter(json.loads(cache_file.read_text()).items()))
    measured = {int(n): t for n, t in entry["seconds"].items()}
    dear = {n: t if n == 1 else 30 * measured[1] + 0.02 + t for n, t in measured.items()}
    calibration.save(key, dear, cache_file)
    engine = ChatEngine(target)
    assert stages_of(engine) == []
    curve = engine._verify_curve.seconds
    assert curve[4] / curve[1] == pytest.approx(dear[4] / dear[1])


def test_a_curve_measured_after_a_reply_chose_fewer_threads_is_found_by_the_next_start(
    cache_file, target, restart_tolerates_load
):
    """A reply on a busy machine runs on fewer threads (engine.runtime.threads); a curve measured then
    (the compiled path switched in between replies) was keyed by that count, and the next start, on
    the default count, did not find it and measured the machine again."""
    import torch

    default = torch.get_num_threads()
    first = ChatEngine(target)
    torch.set_num_threads(max(1, default - 1) if default > 1 else 2)  # what a reply under load leaves
    try:
        assert stages_of(first) == ["Measuring this machine"]
    finally:
        torch.set_num_threads(default)
    assert stages_of(ChatEngine(target)) == []
