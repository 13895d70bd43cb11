"""`tandem-cli models`: the catalogue, models on disk, and which can draft for a target."""

import argparse
import json

import pytest

from engine.cli.models import add_models_parser, run_models
from engine.models.builtin import DEFAULT_TARGET
from engine.models.catalog import drafts_for, list_models, tokenizer_family


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_models_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["models", *argv])


def test_catalogue_lists_the_suggested_gpu_pairs(no_hub_cache):
    specs = {entry.spec: entry for entry in list_models()}
    for spec in (
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
    ):
        assert specs[spec].params and specs[spec].family
    assert specs[DEFAULT_TARGET].family == "smollm2"


def test_family_of_a_local_folder(tiny_model_dir):
    assert tokenizer_family(tiny_model_dir) == ("smollm2", 49152)


def test_qwen_target_gets_qwen_drafts_only(no_hub_cache):
    verdicts = {entry.spec: ok for entry, ok, _ in drafts_for("Qwen/Qwen2.5-7B-Instruct")}
    assert verdicts["Qwen/Qwen2.5-0.5B-Instruct"] and verdicts["Qwen/Qwen2.5-1.5B-Instruct"]
    assert not verdicts["meta-llama/Llama-3.2-1B-Instruct"]
    assert not verdicts[DEFAULT_TARGET]


def test_local_folder_is_compared_by_tokenizer(no_hub_cache, builtin_folder, tiny_model_dir):
    entries = list_models(local_paths=[tiny_model_dir])
    results = {entry.spec: (ok, reason) for entry, ok, reason in drafts_for(DEFAULT_TARGET, entries)}
    assert results[str(tiny_model_dir)] == (True, "tokenizers compared")


def test_cli_table(no_hub_cache, capsys):
    assert run_models(parse()) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-7B-Instruct" in out and "tokenizer family" in out


def test_cli_target_json(no_hub_cache, capsys):
    assert run_models(parse("--target", "meta-llama/Llama-3.1-8B-Instruct", "--json")) == 0
    payload = json.loads(capsys.readouterr().out)
    can = {d["spec"] for d in payload["drafts"] if d["can_draft"]}
    assert can == {"meta-llama/Llama-3.2-1B-Instruct", "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"}


def test_the_cpu_catalogue_offers_gguf_pairs_of_one_family(no_hub_cache):
    from engine.models.manage import draft_cost, gguf_pair_estimate, is_gguf_pair, suggested_pairs

    cpu = [pair for pair in suggested_pairs() if pair.device == "cpu" and pair.target != DEFAULT_TARGET]
    assert {pair.target.split(":")[0] for pair in cpu} == {
        "bartowski/SmolLM2-1.7B-Instruct-GGUF",
        "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
        "bartowski/Qwen2.5-7B-Instruct-GGUF",
    }
    entries = list_models()
    for pair in cpu:
        assert is_gguf_pair(pair)
        ok = {entry.spec: ok for entry, ok, _ in drafts_for(pair.target, entries)}
        assert ok[pair.draft], pair  # the draft shares the target's tokenizer
        small, large = (gguf_pair_estimate(pair, n, available=64 * 1024**3) for n in (1024, 8192))
        assert large.parts["target KV cache"] == 8 * small.parts["target KV cache"] > 0
        assert "of a target step" in draft_cost(pair)
    smol = next(pair for pair in cpu if "SmolLM2" in pair.target)
    assert smol.draft == DEFAULT_TARGET


def test_cli_target_table(no_hub_cache, capsys):
    assert run_models(parse("--target", "HuggingFaceTB/SmolLM2-1.7B-Instruct")) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("HuggingFaceTB/SmolLM2-360M-Instruct"))
    assert " yes " in line
