"""The prompt-speed bench reads prompts through the engine's own prefill (llama-bench's side runs in
test_llama_server.py, with the real build)."""

from __future__ import annotations

from engine.bench import prefill_speed
from engine.decoding import speculative
from engine.models.builtin import DEFAULT_TARGET


def test_tandems_side_reads_each_prompt_length_through_the_engines_prefill(monkeypatch):
    read = []
    real = speculative.prefill

    def counting(runner, prompt, sampling, generator, *rest):
        first = real(runner, prompt, sampling, generator, *rest)
        read.append((len(prompt), runner.cache_length))
        return first

    monkeypatch.setattr(speculative, "prefill", counting)
    speeds = prefill_speed.tandem_prompt_speed(DEFAULT_TARGET, [40, 600], threads=1, repeats=1)
    assert set(speeds) == {40, 600} and all(speed > 0 for speed in speeds.values())
    assert read == [(40, 40)] * 2 + [(600, 600)] * 2  # a warm-up and a measured run, from an empty cache
