"""The draft head: captured target features, the head's layer in training and drafting, file formats,
the shipped head, and losslessness (greedy equality, distribution at T = 0.7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.drafters.head import HeadDrafter
from engine.decoding.planner import planner_for
from engine.decoding.speculative import generate
from engine.decoding.verify_cost import VerifyCostCurve
from engine.errors import IncompatibleDraftError
from engine.heads.head import (
    DraftHead,
    HeadConfig,
    find_head,
    load_head,
    save_head,
    shipped_head_folder,
    target_fingerprint,
)
from engine.heads.training import chained_log_probs
from engine.kernels.cpu_features import has_avx2
from engine.runtime.attention import rows_unavailable_reason
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner
from engine.settings import SamplingSettings, SpeculationSettings


def random_head(model, draft_vocab: int, seed: int = 0, layers=None, scale: float = 0.3) -> DraftHead:
    """A random head over the first `draft_vocab` target ids, with the target's LM-head rows."""
    torch.manual_seed(seed)
    head = DraftHead(HeadConfig.for_target(model.config, draft_vocab, layers))
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=scale / parameter.size(1) ** 0.5)
        ids = torch.randperm(model.config.vocab_size)[:draft_vocab]
        head.set_vocabulary(ids)
        head.lm_head.weight.copy_(model.get_output_embeddings().weight[ids])
    return head.eval()


def drafter_for(head, loaded, runner) -> HeadDrafter:
    return HeadDrafter(head, loaded.model.get_input_embeddings(), runner.vocab_size, runner.context_length)


# --- the target hands back its features -------------------------------------------------------------


@pytest.mark.parametrize("runner_class", [ModelRunner, FastRunner])
def test_runners_hand_back_the_hidden_states_of_their_forward(runner_class, tiny):
    kwargs = {"compiled": "off"} if runner_class is FastRunner else {}
    runner = runner_class(tiny.model, **kwargs)
    runner.reset()
    ids = torch.tensor([5, 17, 99, 3, 250, 8, 41, 7])
    runner.prefill(ids[:5])
    assert runner.last_hidden is None  # off by default
    runner.capture_hidden = (1, 2)  # the input of layer 1 and the final, normed output
    runner.rollback(2)
    runner.prefill(ids[2:5])
    prefill_start, prefill_features = runner.last_hidden
    runner.forward(ids[5:])
    start, features = runner.last_hidden
    with torch.no_grad():
        full = tiny.model(input_ids=ids.view(1, -1), output_hidden_states=True).hidden_states
    expected = torch.cat([full[1][0], full[2][0]], dim=-1)  # [8, 2C]
    assert (prefill_start, start) == (2, 5)
    torch.testing.assert_close(prefill_features, expected[2:5], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(features, expected[5:], atol=1e-4, rtol=1e-4)


# --- training computes what drafting computes ------------------------------------------------------


@pytest.mark.parametrize("row_attention", [True, False])
def test_chained_training_steps_equal_what_the_drafter_computes(make_tiny, row_attention):
    """Step j of the training forward at a position is the drafter's j-th draft from there, whether
    the drafter attends on Tandem's row kernel or as training does (SDPA)."""
    tiny = make_tiny(seed=0, layers=2, hidden=128)  # head size 32: one the row kernel takes
    head = random_head(tiny.model, 64, seed=1, scale=1.0)
    runner = ModelRunner(tiny.model)
    drafter = drafter_for(head, tiny, runner)
    avx2 = has_avx2()
    assert drafter.row_attention == avx2, rows_unavailable_reason()
    if row_attention and not avx2:
        pytest.skip("this CPU has no AVX2, where the row attention kernel runs")
    drafter.row_attention = row_attention
    drafter.begin(SamplingSettings(temperature=1.0), torch.Generator().manual_seed(0))
    context = [11, 230, 5, 77, 1024, 9, 31]
    with torch.no_grad():
        features = tiny.model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states[-1][
            0
        ]
    drafter.observe_target((0, features[: len(context) - 1]), context)
    draft = drafter.propose(context, 3)
    drafted = draft.tokens.tolist()
    sequence = context + drafted[:2]
    with torch.no_grad():
        all_features = tiny.model(
            input_ids=torch.tensor([sequence]), output_hidden_states=True
        ).hidden_states[-1]
        log_probs = chained_log_probs(
            head, tiny.model.get_input_embeddings(), torch.tensor([sequence]), all_features, 3
        )
    last_true = len(context) - 2  # the entry that scores the first draft token
    for step in range(3):
        training = log_probs[step][0, last_true + step].exp()  # [N]
        drafting = draft.probs[step][head.draft_ids]  # [N]
        torch.testing.assert_close(training, drafting, atol=1e-5, rtol=1e-4)
        assert float(draft.probs[step].sum()) == pytest.approx(1.0, abs=1e-5)
        assert float(draft.probs[step][head.draft_ids].sum()) == pytest.approx(1.0, abs=1e-5)  # zero outside


def test_features_of_plain_rounds_read_in_one_forward_draft_what_round_by_round_reading_does(tiny):
    """After plain rounds the head reads their features at once (one forward over the run of them,
    not one per round); its draft must be the one it makes when it reads them round by round."""
    head = random_head(tiny.model, 64, seed=2, scale=1.0)
    runner = ModelRunner(tiny.model)
    context = [11, 230, 5, 77, 1024, 9, 31, 400, 12, 88, 6]
    with torch.no_grad():
        features = tiny.model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states[-1][
            0
        ]
    drafts = []
    for fold_each_round in (True, False):
        drafter = drafter_for(head, tiny, runner)
        drafter.begin(SamplingSettings(temperature=1.0), torch.Generator().manual_seed(0))
        drafter.observe_target((0, features[:5]), context[:6])  # the prompt
        for end in range(6, len(context)):  # one plain round per token
            drafter.observe_target((end - 1, features[end - 1 : end]), context[: end + 1])
            if fold_each_round:
                drafter.prefill(context[: end + 1])
        draft = drafter.propose(context, 3)
        drafts.append((draft.tokens.tolist(), torch.stack(list(draft.probs))))
    assert drafts[0][0] == drafts[1][0]
    torch.testing.assert_close(drafts[0][1], drafts[1][1], atol=1e-5, rtol=1e-4)


# --- files ----------------------------------------------------------------------------------------------


def test_a_saved_head_loads_for_its_target_and_is_refused_by_another(tmp_path, make_tiny, tiny):
    head = random_head(tiny.model, 32)
    head.config.base_model = {"name": tiny.name, "fingerprint": target_fingerprint(tiny.model)}
    save_head(head, tmp_path / "head")
    files = sorted(p.name for p in (tmp_path / "head").iterdir())
    assert files == ["config.json", "model.safetensors"]
    loaded = load_head(tmp_path / "head", tiny.model)
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight, atol=1e-3, rtol=1e-3)  # float16 on disk
    assert torch.equal(loaded.draft_ids, head.draft_ids)
    assert torch.equal(
        loaded.lm_head.weight, tiny.model.lm_head.weight[head.draft_ids]
    )  # taken from the target
    other = make_tiny(seed=7, layers=2)
    with pytest.raises(IncompatibleDraftError, match="trained for tiny-0-2"):
        load_head(tmp_path / "head", other.model)


def write_eagle3_head(folder, target_model, draft_vocab: int, seed: int = 0) -> dict:
    """A tiny head in the layout published EAGLE-3 heads use (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    C, V, n = (
        target_model.config.hidden_size,
        target_model.config.vocab_size,
        target_model.config.num_hidden_layers,
    )
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape):
        return torch.randn(*shape, generator=generator) * 0.3 / shape[-1] ** 0.5

    draft_ids = torch.randperm(V, generator=generator)[:draft_vocab].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    H, KV, D, M = 4, 2, C // 4, 2 * C
    state = {
        "fc.weight": weight(C, 3 * C),
        "midlayer.hidden_norm.weight": torch.ones(C),
        "midlayer.input_layernorm.weight": torch.ones(C),
        "midlayer.post_attention_layernorm.weight": torch.ones(C),
        "midlayer.self_attn.q_proj.weight": weight(H * D, 2 * C),
        "midlayer.self_attn.k_proj.weight": weight(KV * D, 2 * C),
        "midlayer.self_attn.v_proj.weight": weight(KV * D, 2 * C),
        "midlayer.self_attn.o_proj.weight": weight(C, H * D),
        "midlayer.mlp.gate_proj.weight": weight(M, C),
        "midlayer.mlp.up_proj.weight": weight(M, C),
        "midlayer.mlp.down_proj.weight": weight(C, M),
        "norm.weight": torch.ones(C),
        "lm_head.weight": weight(draft_vocab, C) * 20,
        "d2t": draft_ids - torch.arange(draft_vocab),
        "t2d": t2d,
    }
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": C,
        "intermediate_size": M,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": V,
        "draft_vocab_size": draft_vocab,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
    }
    (folder / "config.json").write_text(json.dumps(config))
    assert n >= 6
    return state


def test_a_published_eagle3_head_loads_and_drafts_losslessly(tmp_path, make_tiny, builtin_tokenizer):
    target = make_tiny(seed=3, layers=8)
    state = write_eagle3_head(tmp_path / "eagle3", target.model, draft_vocab=512)
    head = load_head(tmp_path / "eagle3", target.model)
    assert head.config.target_layers == [2, 4, 5]  # low, middle and high features: layers 2, N/2, N-3
    assert head.config.own_lm_head
    torch.testing.assert_close(head.lm_head.weight, state["lm_head.weight"])
    torch.testing.assert_close(
        head.midlayer.self_attn.q_proj.weight, state["midlayer.self_attn.q_proj.weight"]
    )
    assert torch.equal(head.draft_ids, torch.arange(512) + state["d2t"])
    assert torch.equal(head.t2d, state["t2d"])

    prompt = builtin_tokenizer("The tiny model says", add_special_tokens=False).input_ids
    sampling = SamplingSettings(max_new_tokens=24)
    plainly, speculation = SpeculationSettings(drafter="none"), SpeculationSettings(k=4)
    plain = generate(
        ModelRunner(target.model),
        planner_for([], plainly, VerifyCostCurve()),
        prompt,
        sampling,
        plainly,
        set(),
        builtin_tokenizer,
    )
    runner = FastRunner(target.model, compiled="off")
    drafter = drafter_for(head, target, runner)
    ours = generate(
        runner,
        planner_for([drafter], speculation, VerifyCostCurve()),
        prompt,
        sampling,
        speculation,
        set(),
        builtin_tokenizer,
    )
    assert ours.token_ids == plain.token_ids
    assert ours.stats.drafted > 0


def test_a_folder_that_is_not_a_head_gets_a_clear_message(tmp_path, tiny):
    from engine.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="not a draft head"):
        find_head(tiny, tmp_path)
    with pytest.raises(IncompatibleDraftError, match="No draft head ships for tiny-0-2.*train-head"):
        find_head(tiny)


# --- the shipped head -----------------------------------------------------------------------------------


def test_the_shipped_head_is_for_the_builtin_model_and_refused_by_any_other(builtin_model, make_tiny):
    folder = shipped_head_folder(builtin_model.name)
    assert folder is not None, "resources/heads/ has no head for the built-in model"
    config = json.loads((folder / "config.json").read_text())
    assert config["base_model"]["fingerprint"] == target_fingerprint(builtin_model.model)
    assert (folder / "model.safetensors").stat().st_size < 16 * 1024**2
    assert {"recipe", "prompts", "tokens_generated", "tokens_trained", "wall_s"} <= set(config["training"])
    head = load_head(folder, builtin_model.model)
    assert head.config.draft_vocab_size == config["draft_vocab_size"]
    eos = next(iter(builtin_model.eos_token_ids))
    assert bool(head.t2d[eos]), "the end-of-reply token must be in the draft vocabulary"
    other = make_tiny(seed=0, layers=2)
    with pytest.raises(IncompatibleDraftError, match="trained for smollm2-135m-instruct"):
        load_head(folder, other.model)


def test_a_head_narrowed_or_widened_keeps_its_scores_on_the_tokens_it_keeps(tiny):
    """N is a measurement (bench --head-vocab): a prefix of the head's own vocabulary, or its own plus
    the target's next ids, every one scored with the target's LM-head row."""
    lm_head = tiny.model.get_output_embeddings().weight
    out = torch.randn(tiny.model.config.hidden_size)
    head = random_head(tiny.model, 64)
    own, scores = head.draft_ids.clone(), head.logits(out)
    head.widened(96, lm_head)
    assert head.draft_ids.numel() == head.config.draft_vocab_size == 96
    assert torch.equal(head.draft_ids[:64], own) and head.draft_ids.unique().numel() == 96
    assert int(head.t2d.sum()) == 96
    widened_scores = head.logits(out)
    torch.testing.assert_close(widened_scores[:64], scores)
    torch.testing.assert_close(widened_scores[64:], head.norm(out) @ lm_head[head.draft_ids[64:]].T)
    head.truncated(32)
    assert torch.equal(head.draft_ids, own[:32])
    torch.testing.assert_close(head.logits(out), scores[:32])
    whole = random_head(tiny.model, 64).widened(10**6, lm_head)
    assert whole.config.draft_vocab_size == tiny.model.config.vocab_size


def test_a_head_with_fused_projections_drafts_what_its_separate_layers_draft(tiny):
    """Drafting joins q, k, v and gate, up into one layer each: the same rows, so the same scores."""
    from engine.heads.quant import quantized_layers

    embed = tiny.model.get_input_embeddings()
    ids = torch.randint(0, tiny.model.config.vocab_size, (1, 12))
    features = torch.randn(1, 12, tiny.model.config.hidden_size)
    head = random_head(tiny.model, 64, seed=3)
    with torch.inference_mode():
        separate = chained_log_probs(head, embed, ids, features, 2)
        head.fuse_projections()
        fused = chained_log_probs(head, embed, ids, features, 2)
    names = set(quantized_layers(head))
    assert {"midlayer.self_attn.qkv_proj", "midlayer.mlp.gate_up_proj"} <= names
    assert not {"midlayer.self_attn.q_proj", "midlayer.mlp.up_proj"} & names
    for before, after in zip(separate, fused, strict=True):
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def builtin_engine(builtin_model):
    from engine.session import ChatEngine

    return ChatEngine(builtin_model, compiled="off")


@pytest.mark.parametrize(
    "question, k",
    [("Explain how a rainbow forms.", 4), ("Write a Python function that adds two numbers.", None)],
)
def test_greedy_output_with_the_shipped_head_is_the_targets(builtin_engine, question, k):
    """At a fixed K, and adaptive, where the head stops each draft by its own confidence."""
    engine = builtin_engine
    messages = [{"role": "user", "content": question}]
    engine.sampling = SamplingSettings(max_new_tokens=48)
    engine.speculation = SpeculationSettings(drafter="none")
    engine.reset()
    alone = engine.respond(messages)
    engine.speculation = SpeculationSettings(drafter="head", k=k)
    engine.reset()
    with_head = engine.respond(messages)
    assert with_head.token_ids == alone.token_ids
    assert (engine.head_drafter().stop_rule is not None) == (k is None)
    assert with_head.stats.drafter == "head"
    training = json.loads((shipped_head_folder(engine.target.name) / "config.json").read_text())["training"]
    assert engine.head_drafter().acceptance_prior == tuple(training["final_top1_by_step"][:2])
    assert with_head.stats.accepted > 0, "the trained head never drafted a token the target kept"


# --- the distribution at T = 0.7 -------------------------------------------------------------------------

V_SMALL = 16


class MisreportingHeadDrafter(HeadDrafter):
    """Negative control: samples from the head but claims a uniform distribution over every token."""

    def propose(self, context, k):
        draft = super().propose(context, k)
        if draft.probs is not None:
            draft.probs = torch.full_like(draft.probs, 1.0 / draft.probs.size(-1))
        return draft


@dataclass
class SamplingSetup:
    """A 16-token target softer than the default scale (many tokens have mass), a head drafting over 8
    of its ids, one context with the target's features, and the target's T = 0.7 distributions: after
    the context (`first`) and after each one-token continuation of it (`after`)."""

    drafter: HeadDrafter
    context: list[int]
    features: torch.Tensor
    first: torch.Tensor
    after: dict[int, torch.Tensor]
    target_probs: Callable[[list[int]], torch.Tensor]


def sampling_setup(drafter_class, builtin_tokenizer) -> SamplingSetup:
    from tests.tiny_models import build_tiny_llama

    model = build_tiny_llama(builtin_tokenizer, seed=4, layers=2, vocab_size=V_SMALL)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)
    head = random_head(model, 8, seed=5, scale=2.0)
    drafter = drafter_class(head, model.get_input_embeddings(), V_SMALL, ModelRunner(model).context_length)
    drafter.begin(SamplingSettings(temperature=0.7), torch.Generator().manual_seed(1))
    context = [3, 9, 1, 12]

    def target_probs(ids):  # [V] at T = 0.7
        with torch.no_grad():
            return (model(input_ids=torch.tensor([ids])).logits[0, -1] / 0.7).softmax(-1)

    with torch.no_grad():
        features = model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states[-1][0]
    after = {d: target_probs(context + [d]) for d in range(V_SMALL)}
    return SamplingSetup(drafter, context, features, target_probs(context), after, target_probs)


def emitted_tokens(drafter_class, runs: int, builtin_tokenizer):
    """`runs` rounds of K=2 from one context: the head drafts (it reads the target's features), the
    target verifies with accept_reject. Returns the first and second emitted tokens and the target's
    exact distributions for them."""
    from engine.decoding.sampling import accept_reject

    setup = sampling_setup(drafter_class, builtin_tokenizer)
    drafter, context, features = setup.drafter, setup.context, setup.features
    first, after = setup.first, setup.after
    target_probs = setup.target_probs
    after2 = {}
    tokens, probs, verify = [], [], []
    for _ in range(runs):
        drafter.reset()
        drafter.observe_target((0, features[: len(context) - 1]), context)
        draft = drafter.propose(context, 2)
        d1, d2 = draft.tokens.tolist()
        if (d1, d2) not in after2:
            after2[(d1, d2)] = target_probs(context + [d1, d2])
        tokens.append(draft.tokens)
        probs.append(draft.probs)
        verify.append(torch.stack([first, after[d1], after2[(d1, d2)]]))
    draft_tokens = torch.stack(tokens)  # [runs, 2]
    num_accepted, next_token = accept_reject(
        draft_tokens, torch.stack(probs), torch.stack(verify), torch.Generator().manual_seed(2)
    )
    emitted_first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)
    second_exact = sum(first[d] * after[d] for d in range(V_SMALL))  # marginal of the second token
    has_second = num_accepted > 0  # the second emitted token comes from this round only then
    emitted_second = torch.where(num_accepted > 1, draft_tokens[:, 1], next_token)[has_second]
    return (
        emitted_first,
        emitted_second,
        first.double(),
        [after[d].double() for d in range(V_SMALL)],
        draft_tokens,
        second_exact,
    )


def total_variation_and_p(samples, probs):
    counts = torch.bincount(samples, minlength=V_SMALL).double()
    expected = probs.double() * counts.sum()
    keep = expected > 0
    scaled = expected[keep] * counts[keep].sum() / expected[keep].sum()
    p_value = chisquare(counts[keep].numpy(), scaled.numpy()).pvalue
    return 0.5 * (counts / counts.sum() - probs.double()).abs().sum().item(), p_value


def test_sampling_with_the_head_keeps_the_targets_distribution(builtin_tokenizer):
    """The first token a round emits follows the target's distribution although the head drafts over
    8 of 16 ids (zero elsewhere); a drafter that misreports its distribution is caught by the same test."""
    torch.manual_seed(0)
    first, _, exact, _, drafts, _ = emitted_tokens(HeadDrafter, 4000, builtin_tokenizer)
    assert set(drafts.flatten().tolist()) <= set(range(V_SMALL))
    tv, p = total_variation_and_p(first, exact)
    assert p > 1e-3 and tv < 0.04, (tv, p)

    torch.manual_seed(0)
    broken, _, _, _, _, _ = emitted_tokens(MisreportingHeadDrafter, 4000, builtin_tokenizer)
    tv_broken, p_broken = total_variation_and_p(broken, exact)
    assert p_broken < 1e-3, "the distribution test missed a drafter that misreports its probabilities"
    assert tv_broken > tv


def test_the_catalogue_lists_the_shipped_head_and_a_published_eagle3_pair():
    from engine.models.catalog import catalogue_path

    heads = json.loads(catalogue_path().read_text())["heads"]
    shipped = next(h for h in heads if h["target"] == "builtin:smollm2-135m-instruct")
    assert shipped["head"].endswith("heads/smollm2-135m-instruct")
    published = [h for h in heads if h["format"] == "eagle3"]
    assert published and all(h["device"] == "cuda" and "/" in h["head"] for h in published)


def test_training_prompts_mix_templates_with_work_on_texts_and_code_and_never_bench_prompts():
    from engine.bench.prompts import default_prompts_path, load_prompts
    from engine.heads.prompts import template_instructions, training_instructions

    instructions = training_instructions(500)
    assert len(instructions) == len(set(instructions)) == 500
    assert instructions[:300] == template_instructions(300)  # a longer run reuses a shorter one's answers
    rest = instructions[300:]
    assert sum("```python" in text for text in rest) >= 50 and sum("Translate" in text for text in rest) >= 10
    bench_turns = {turn for prompt in load_prompts(default_prompts_path()) for turn in prompt.turns}
    assert not bench_turns.intersection(instructions)


def test_train_head_writes_texts_works_on_them_resumes_and_goes_on_from_a_head(tmp_path, tiny_model_dir):
    from engine.cli.main import main
    from engine.heads.head import load_head
    from engine.models.loading import load_model

    out = tmp_path / "head"
    argv = [
        "train-head",
        "--target",
        str(tiny_model_dir),
        "--out",
        str(out),
        "--prompts",
        "8",
        "--answer-tokens",
        "6",
        "--epochs",
        "1",
        "--steps",
        "2",
        "--draft-vocab",
        "256",
        "--batch",
        "4",
        "--written-share",
        "0.5",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    written = [entry["text"] for entry in json.loads((out / "work" / "passages.json").read_text())]
    assert len(written) == 3  # 4 tasks over texts at 2 a text, plus a quarter spare
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["recipe"]["written_share"] == 0.5 and config["training"]["prompts"] == 8
    head = load_head(out, load_model(str(tiny_model_dir), device="cpu").model)
    assert head.config.draft_vocab_size == 256

    stamp = (out / "work" / "passages.json").stat().st_mtime_ns
    assert main(argv) == 0  # resumes: the texts are not written again
    assert (out / "work" / "passages.json").stat().st_mtime_ns == stamp
    assert main([*argv[:-2], "--written-share", "1.5"]) == 2

    further = tmp_path / "further"
    assert (
        main(
            [
                *argv[:4],
                str(further),
                "--prompts",
                "4",
                "--answer-tokens",
                "6",
                "--epochs",
                "1",
                "--written-share",
                "0",
                "--seed",
                "1",
                "--init-from",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    trained_on = load_head(further, load_model(str(tiny_model_dir), device="cpu").model)
    assert torch.equal(trained_on.draft_ids, head.draft_ids)  # the vocabulary stays
    assert not torch.equal(trained_on.fc.weight, head.fc.weight)  # trained on from the first head
    record = json.loads((further / "config.json").read_text())["training"]
    assert record["started_from"]["training"]["recipe"]["written_share"] == 0.5
    # a head for another target is refused before any work, with a message
    x = str(tmp_path / "x")
    other = [*argv[:2], "builtin:smollm2-135m-instruct", "--out", x, "--init-from", str(out)]
    assert main(other) == 2
    assert not (tmp_path / "x").exists()


def test_written_texts_are_kept_only_for_the_requests_they_were_written_for(tmp_path, make_tiny):
    from engine.heads.passages import write_passages, writing_requests

    loaded = make_tiny()
    first = writing_requests(3, seed=0)
    write_passages(loaded, first, "cpu", tmp_path, batch=2, tokens=4)
    stored = json.loads((tmp_path / "passages.json").read_text())
    assert [entry["request"] for entry in stored] == [request for _, request in first]

    changed = [first[0], ("email", "Write an email about nothing in particular."), first[2]]
    rewritten: list[int] = []
    write_passages(loaded, changed, "cpu", tmp_path, batch=2, tokens=4, progress=rewritten.append)
    restored = json.loads((tmp_path / "passages.json").read_text())
    assert [entry["request"] for entry in restored] == [request for _, request in changed]
    assert restored[0]["text"] == stored[0]["text"]  # written for the same request: kept
    # from the first request that differs on, every text is written anew, the third one too
    assert sum(rewritten) == 2


def test_the_target_writes_user_questions_that_train_the_head_and_bad_shares_are_refused(
    tmp_path, tiny_model_dir
):
    from engine.cli.main import main

    out = tmp_path / "head"
    argv = [
        "train-head",
        "--target",
        str(tiny_model_dir),
        "--out",
        str(out),
        "--prompts",
        "6",
        "--answer-tokens",
        "4",
        "--epochs",
        "1",
        "--steps",
        "1",
        "--draft-vocab",
        "128",
        "--batch",
        "3",
        "--generate-batch",
        "4",
        "--asked-share",
        "0.5",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    asked = json.loads((out / "work" / "questions.json").read_text())
    assert len(asked) == 4  # 3 questions wanted, a third more asked for
    recipe = json.loads((out / "config.json").read_text())["training"]["recipe"]
    assert recipe["asked_share"] == 0.5 and recipe["generate_batch"] == 4
    for bad in (
        ["--asked-share", "0.7", "--written-share", "0.5"],
        ["--asked-share", "-0.1"],
        ["--generate-batch", "0"],
    ):
        assert main([*argv[:-2], *bad, "--device", "cpu"]) == 2


def test_a_written_question_is_its_first_paragraph_unquoted_and_of_a_message_s_length():
    from engine.heads.questions import question_requests, tidy_question

    assert tidy_question('  "How do bees find their way home?"\n\nI hope this helps!') == (
        "How do bees find their way home?"
    )
    assert tidy_question("Question: Why is the sky blue?") == "Why is the sky blue?"
    assert tidy_question("Why?") is None and tidy_question("x" * 500) is None
    requests = question_requests(50, seed=3)
    assert len({r for _, r in requests}) == 50 and requests == question_requests(50, seed=3)


def test_the_draft_vocabulary_takes_an_empty_answer_in_its_stride():
    from engine.heads.training import choose_vocabulary

    counts = torch.zeros(16, dtype=torch.float64)
    counts[3] = 2.0
    chosen = choose_vocabulary(counts, [[], [5, 5, 5]], size=3, always={0})
    assert chosen.tolist() == [0, 5, 3]
