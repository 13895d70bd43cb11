"""One draft/target compatibility rule: the engine, the catalogue and the settings probes give one verdict."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.models import catalog, probes
from engine.models.builtin import DEFAULT_TARGET
from engine.models.compat import compatibility
from engine.models.loaded import LoadedModel
from engine.session import ChatEngine, check_compatible


def tokenizer_folder(source, destination, edit=None):
    """A model folder holding the source's config and tokenizer (no weights), optionally edited."""
    destination.mkdir()
    for path in source.iterdir():
        if path.suffix in (".json", ".jinja") and path.name != "tandem-converted.json":
            shutil.copy(path, destination / path.name)
    if edit is not None:
        data = json.loads((destination / "tokenizer.json").read_text())
        edit(data)
        (destination / "tokenizer.json").write_text(json.dumps(data))
    return destination


def add_one_token(data):
    used = set(data["model"]["vocab"].values()) | {t["id"] for t in data["added_tokens"]}
    data["added_tokens"].append(
        {
            "id": max(used) + 1,
            "content": "<|tool_call|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )


def swap_two_tokens(data):
    vocab = data["model"]["vocab"]
    by_id = {token_id: token for token, token_id in vocab.items()}
    vocab[by_id[200]], vocab[by_id[201]] = 201, 200


def verdicts(folder, target: LoadedModel, make_draft) -> dict[str, bool]:
    """The verdict of every place that decides whether `folder` can draft for the built-in target."""
    from engine.models.loading import load_tokenizer

    draft_tokenizer = load_tokenizer(folder)
    draft = make_draft(draft_tokenizer)
    try:
        check_compatible(target, draft)
        ChatEngine(target, draft)
        engine_ok = True
    except Exception as error:  # IncompatibleDraftError is what a refusal looks like
        assert type(error).__name__ == "IncompatibleDraftError"
        engine_ok = False
    target_entry = catalog.find_entry(DEFAULT_TARGET, catalog.list_models(include_catalogue=False))
    draft_entry = catalog.local_entries([folder])[0]
    return {
        "compat": compatibility(target.tokenizer, draft_tokenizer, target.model.config, draft.model.config)[
            0
        ],
        "engine": engine_ok,
        "catalog": catalog.can_draft(target_entry, draft_entry)[0],
        "settings": probes.check_draft(DEFAULT_TARGET, str(folder))[0],
    }


@pytest.fixture
def builtin_target(builtin_model):
    return builtin_model


@pytest.fixture
def make_draft():
    def make(tokenizer) -> LoadedModel:
        import torch
        from conftest import build_tiny_llama

        model = build_tiny_llama(tokenizer, layers=1, hidden=32)
        return LoadedModel("edited-draft", model, tokenizer, torch.device("cpu"), torch.float32)

    return make


def test_a_draft_with_one_added_token_gets_the_same_verdict_everywhere(
    tmp_path, builtin_folder, builtin_target, make_draft
):
    folder = tokenizer_folder(builtin_folder, tmp_path / "one-more-token", add_one_token)
    found = verdicts(folder, builtin_target, make_draft)
    assert found == {"compat": True, "engine": True, "catalog": True, "settings": True}


def test_a_draft_with_two_tokens_swapped_is_refused_everywhere(
    tmp_path, builtin_folder, builtin_target, make_draft
):
    folder = tokenizer_folder(builtin_folder, tmp_path / "swapped", swap_two_tokens)
    found = verdicts(folder, builtin_target, make_draft)
    assert found == {"compat": False, "engine": False, "catalog": False, "settings": False}
