from __future__ import annotations

import dataclasses
import re

import pytest

from app.config import DEFAULT_DRAFTER, STORE_KEY, AppConfig
from engine.errors import SettingsError
from engine.models.builtin import DEFAULT_TARGET
from engine.settings import DEFAULT_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, MAX_K


def test_defaults_draft_with_a_quantized_copy_of_the_builtin_target():
    config = AppConfig()
    assert config.target == DEFAULT_TARGET
    assert config.drafter == DEFAULT_DRAFTER  # "auto" where the engine has it
    assert config.draft == DEFAULT_TARGET
    assert config.draft_quantization == "auto"  # INT4 for the built-in target (its weights are Q4_1 blocks)
    assert config.k_mode == "adaptive"
    config.validate()


def test_speculation_carries_drafter_and_fixed_k():
    config = AppConfig(drafter="ngram", k_mode="fixed", k=7, max_k=12, p_min=0.3)
    spec = config.speculation()
    assert (spec.drafter, spec.k, spec.max_k, spec.p_min) == ("ngram", 7, 12, 0.3)
    assert not spec.adaptive


def test_adaptive_mode_maps_to_no_fixed_k():
    spec = AppConfig(k_mode="adaptive", k=7).speculation()
    assert spec.k is None and spec.adaptive


def test_sampling_carries_every_field():
    config = AppConfig(temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=64, seed=123)
    sampling = config.sampling()
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, sampling.seed) == (
        0.7,
        0.9,
        40,
        64,
        123,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"k_mode": "fixed", "k": MAX_K + 1}, f"K must be between 1 and {MAX_K}"),
        ({"k": 0}, f"K must be between 1 and {MAX_K}"),
        ({"max_k": 17}, "Max K must be between 1"),
        ({"p_min": 1.0}, "p_min must be in [0, 1)"),
        ({"temperature": -1.0}, "Temperature must be between 0 and 5"),
        ({"top_p": 0.0}, "top-p must be in (0, 1]"),
        ({"max_new_tokens": 0}, "Max new tokens must be at least 1"),
        ({"drafter": "medusa"}, "Unknown drafter 'medusa'"),
        ({"device": "tpu"}, "Device must be one of auto, cpu, cuda"),
        ({"draft_quantization": "int2"}, "Draft quantization must be one of"),
        ({"drafter": "model", "draft": " "}, "Choose a draft model"),
        ({"target": ""}, "Choose a target model"),
        ({"context": 255}, "The context must be at least 256 tokens"),
        ({"context": MAX_CONTEXT_TOKENS + 1}, "The context must be at most 1,048,576 tokens"),
    ],
)
def test_validate_refuses_with_the_engine_message(change, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        dataclasses.replace(AppConfig(), **change).validate()


def test_an_empty_draft_is_fine_when_not_drafting_with_a_model():
    AppConfig(drafter="ngram", draft="").validate()


def test_dict_round_trip():
    config = AppConfig(
        drafter="none", k_mode="fixed", k=3, temperature=0.5, seed=9, system_prompt="Be brief."
    )
    assert AppConfig.from_dict(config.to_dict()) == config


def test_from_dict_ignores_unknown_keys_and_defaults_missing_ones():
    config = AppConfig.from_dict({"temperature": 0.8, "from_the_future": True})
    assert config.temperature == 0.8
    assert config.top_p == AppConfig().top_p
    assert AppConfig.from_dict(None) == AppConfig()
    assert AppConfig.from_dict(["not", "a", "dict"]) == AppConfig()


def test_from_dict_drops_values_of_the_wrong_type():
    config = AppConfig.from_dict({"k": "seven", "draft_on_cpu": "yes", "temperature": 1, "seed": True})
    assert config.k == AppConfig().k
    assert config.draft_on_cpu is False
    assert config.temperature == 1.0 and isinstance(config.temperature, float)
    assert config.seed is None


def test_only_a_change_of_model_needs_a_load():
    base = AppConfig()  # drafter auto: the draft model is loaded
    assert not dataclasses.replace(base, temperature=1.0, k_mode="fixed", k=2).needs_load(base)
    assert dataclasses.replace(base, target="/models/other").needs_load(base)
    assert dataclasses.replace(base, device="cpu").needs_load(base)
    assert dataclasses.replace(base, draft_quantization="int4").needs_load(base)
    assert dataclasses.replace(base, context=4096).needs_load(base)  # its KV cache is sized at load
    assert base.needs_load(None)
    # the drafter alone: the loaded draft model stays for a switch back, and nothing loads
    ngram = dataclasses.replace(base, drafter="ngram")
    assert not ngram.needs_load(base)
    assert not dataclasses.replace(base, drafter="model").needs_load(base)  # what was loaded is compared
    assert not dataclasses.replace(ngram, drafter="none", draft_quantization="int4").needs_load(ngram)
    assert not ngram.target_changed(base)
    # a drafter that needs a draft model, where none was loaded for it: that model loads
    assert base.needs_load(ngram)


def test_with_models_of_keeps_sampling_and_takes_the_models():
    mine = AppConfig(temperature=0.7, drafter="ngram")
    other = AppConfig(target="/models/x", draft="/models/y", temperature=0.1)
    mixed = mine.with_models_of(other)
    assert (mixed.target, mixed.draft, mixed.temperature, mixed.drafter) == (
        "/models/x",
        "/models/y",
        0.7,
        "ngram",
    )


def test_save_and_load_through_the_store(store):
    config = AppConfig(drafter="ngram", k_mode="fixed", k=5, top_k=20, system_prompt="Answer in French.")
    config.save(store)
    assert store.get_setting(STORE_KEY)["k"] == 5
    assert AppConfig.load(store) == config


def test_load_without_stored_config_gives_defaults(store):
    assert AppConfig.load(store) == AppConfig()


def test_load_reverts_only_the_invalid_value(store):
    stored = AppConfig(temperature=0.9, seed=4).to_dict() | {"k": 99}
    store.set_setting(STORE_KEY, stored)
    loaded = AppConfig.load(store)
    assert loaded.k == AppConfig().k
    assert (loaded.temperature, loaded.seed) == (0.9, 4)
    loaded.validate()


@pytest.mark.parametrize("stored", [100, 10**9, "4096", 4096.0, True, None, [4096]])
def test_a_bad_stored_context_reads_as_the_default_and_the_rest_stays(store, stored):
    store.set_setting(STORE_KEY, AppConfig(temperature=0.9).to_dict() | {"context": stored})
    loaded = AppConfig.load(store)
    assert loaded.context == DEFAULT_CONTEXT_TOKENS and loaded.temperature == 0.9


def test_an_old_config_without_a_context_reads_the_default(store):
    stored = AppConfig(top_k=20).to_dict()
    del stored["context"]
    store.set_setting(STORE_KEY, stored)
    assert AppConfig.load(store) == AppConfig(top_k=20, context=DEFAULT_CONTEXT_TOKENS)


def test_the_context_chosen_is_what_the_load_request_asks_for():
    from app.engine_factory import LoadRequest

    assert LoadRequest.from_config(AppConfig(context=4096)).context == 4096
    assert LoadRequest.from_config(AppConfig()).context == DEFAULT_CONTEXT_TOKENS


def test_a_server_backend_needs_a_url():
    with pytest.raises(SettingsError, match="http"):
        AppConfig(backend="server", server_url="localhost:8080").validate()
    AppConfig(backend="server", server_url="http://127.0.0.1:8080/v1").validate()


def test_stop_strings_one_per_line():
    assert AppConfig(stop_strings="END\n\n###").stops() == ("END", "###")


def test_a_bad_saved_target_falls_back_to_the_last_working_config_with_a_message(store, tmp_path):
    from engine.models.loading import spec_kind

    working = AppConfig(drafter="ngram", temperature=0.3)
    working.save_working(store)
    broken = dataclasses.replace(working, target=str(tmp_path / "gone"), temperature=0.9)
    broken.save(store)
    config, message = AppConfig.load_for_start(store, lambda c: spec_kind(c.target))
    assert config == working
    assert "No model at" in message and "gone" in message
    assert AppConfig.load(store) == working  # the next start does not meet the same error


def test_a_bad_saved_target_without_a_working_config_falls_back_to_the_defaults(store, tmp_path):
    from engine.models.loading import spec_kind

    AppConfig(target=str(tmp_path / "gone"), temperature=0.9).save(store)
    config, message = AppConfig.load_for_start(store, lambda c: spec_kind(c.target))
    assert config.target == DEFAULT_TARGET and config.temperature == 0.9
    assert message
    assert AppConfig.load_for_start(store, lambda c: spec_kind(c.target)) == (config, "")
