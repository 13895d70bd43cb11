"""Loading from every offline source, and the errors a user can cause with a bad source."""

import json
import shutil

import pytest
import torch

from engine.errors import ModelFormatError, ModelNotFoundError, OfflineError
from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path, is_converted
from engine.models.hub import download_model
from engine.models.loaded import resolve_dtype
from engine.models.loading import gguf_cache_folder, load_model, spec_kind


def greedy_tokens(loaded, prompt: str = "The capital of France is", count: int = 8) -> list[int]:
    inputs = loaded.tokenizer(prompt, return_tensors="pt")
    out = loaded.model.generate(**inputs, max_new_tokens=count, min_new_tokens=count, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_load_from_a_folder(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), device="cpu")
    assert loaded.dtype == torch.float32 and loaded.device.type == "cpu"
    assert loaded.path == tiny_model_dir and loaded.info["source"] == "folder"
    assert loaded.info["memory_bytes"] == loaded.info["memory_bytes_before"] > 0
    assert len(greedy_tokens(loaded, count=4)) == 4


def test_dtype_is_overridable(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), device="cpu", dtype="bf16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def test_auto_dtype_on_cpu_is_fp32():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_load_builtin(builtin_model):
    assert builtin_model.spec == DEFAULT_TARGET
    assert builtin_model.quantization == "none"
    assert builtin_model.info["source"] == "builtin"


def test_missing_path_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="No model at"):
        load_model(str(tmp_path / "nowhere" / "model"))


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "nobody/no-such-model"])
@pytest.mark.timeout(120)  # a hang guard: offline must fail, not wait
def test_hub_id_offline_is_a_clear_error(offline_hub, spec):
    with pytest.raises(OfflineError, match="not available offline"):
        load_model(spec)


@pytest.mark.timeout(120)  # a hang guard: an unreachable endpoint must fail, not wait
def test_unreachable_hub_endpoint_is_a_clear_error(tmp_path):
    with pytest.raises(OfflineError, match="not available offline"):
        download_model("Qwen/Qwen2.5-0.5B-Instruct", endpoint="http://127.0.0.1:9", cache_dir=tmp_path)


def test_hub_id_recognised():
    assert spec_kind("Qwen/Qwen2.5-0.5B-Instruct") == "hub"
    assert spec_kind(DEFAULT_TARGET) == "builtin"


def test_pickle_checkpoint_is_refused(tmp_path, tiny_model_dir):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_model_dir / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ModelFormatError, match="arbitrary code"):
        load_model(str(folder))
    with pytest.raises(ModelFormatError, match="arbitrary code"):
        load_model(str(folder / "pytorch_model.bin"))


def test_truncated_safetensors_names_the_file(tmp_path, tiny_model_dir):
    weights = tiny_model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFormatError, match=r"model\.safetensors.*truncated"):
        load_model(str(tiny_model_dir))


def test_corrupt_safetensors_header_names_the_file(tiny_model_dir):
    (tiny_model_dir / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelFormatError, match=r"model\.safetensors"):
        load_model(str(tiny_model_dir))


def test_missing_shard_is_reported(tiny_model_dir):
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (tiny_model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFormatError, match="model-00002-of-00002"):
        load_model(str(tiny_model_dir))


def test_remote_code_is_never_run(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(model_type="tandem-custom-arch", auto_map={"AutoModelForCausalLM": "modeling.Custom"})
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    (tiny_model_dir / "modeling.py").write_text("raise SystemExit('model code ran')\n")
    with pytest.raises(ModelFormatError):
        load_model(str(tiny_model_dir))


def test_not_a_gguf_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        load_model(str(fake))


def test_gguf_cache_key_follows_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF1")
    first = gguf_cache_folder(gguf)
    assert first == gguf_cache_folder(gguf)
    gguf.write_bytes(b"GGUF12")
    assert gguf_cache_folder(gguf) != first


@pytest.mark.slow
def test_load_a_gguf_file_and_reuse_its_conversion(tmp_path, monkeypatch, builtin_model):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    gguf = builtin_gguf_path(builtin_entry(DEFAULT_TARGET))
    stages = []
    loaded = load_model(
        str(gguf), device="cpu", precision="fp32", progress=lambda stage, done, total: stages.append(stage)
    )
    assert loaded.info["source"] == "gguf" and stages
    assert loaded.path == gguf_cache_folder(gguf) and is_converted(loaded.path)
    assert str(loaded.path).startswith(str(tmp_path))
    assert greedy_tokens(loaded) == greedy_tokens(builtin_model)

    stamp = (loaded.path / "model.safetensors").stat().st_mtime_ns
    again = load_model(str(gguf), device="cpu", precision="fp32")
    assert (again.path / "model.safetensors").stat().st_mtime_ns == stamp


def test_download_progress_reaches_the_callback():
    from engine.models.hub import progress_bar_class

    reports = []
    bar = progress_bar_class(lambda stage, done, total: reports.append((stage, done, total)))(
        total=10, desc="Downloading bytes"
    )
    bar.update(3)
    bar.update(7)
    bar.close()
    assert reports[-1] == ("Downloading bytes", 10, 10)
    assert ("Downloading bytes", 3, 10) in reports


def test_folder_without_safetensors_explains_why(tmp_path, tiny_model_dir):
    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(tiny_model_dir / "config.json", folder)
    with pytest.raises(ModelFormatError, match="only safetensors"):
        load_model(str(folder))
