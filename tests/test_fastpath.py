"""FastRunner: the static-cache forward against transformers, compiled against eager, and fallbacks."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import TREE, FastRunner, causal_mask

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("compilation_allowed")  # these tests are about compilation

# prefill, then verify/decode/rollback steps as ("forward", n) or ("rollback", length)
SCRIPT = [("forward", 5), ("forward", 1), ("rollback", 14), ("forward", 3), ("forward", 1), ("rollback", 10)]
SCRIPT += [("forward", 4), ("forward", 1), ("forward", 3), ("rollback", 16), ("forward", 3)]


def replay(runner, prompt: list[int], seed: int = 0) -> list[torch.Tensor]:
    """Runs SCRIPT with random new tokens; returns every logits tensor in order."""
    generator = torch.Generator().manual_seed(seed)
    runner.reset()
    outputs = [runner.prefill(prompt)]
    for op, value in SCRIPT:
        if op == "rollback":
            runner.rollback(value)
        else:
            ids = torch.randint(0, runner.vocab_size, (value,), generator=generator)
            outputs.append(runner.forward(ids))
    assert runner.cache_length == 16 + 3
    return outputs


def greedy(runner, prompt: list[int], steps: int = 12) -> list[int]:
    runner.reset()
    token = int(runner.prefill(prompt).argmax())
    tokens = [token]
    for _ in range(steps - 1):
        token = int(runner.forward([token])[-1].argmax())
        tokens.append(token)
    return tokens


def greedy_verify(runner, prompt: list[int], steps: int = 12, k: int = 3) -> list[int]:
    """Greedy decoding through K+1-token verify forwards with a wrong guess, then rollback."""
    runner.reset()
    tokens = [int(runner.prefill(prompt).argmax())]
    while len(tokens) < steps:
        length = runner.cache_length
        logits = runner.forward([tokens[-1]] + [7] * k)  # [k+1, V]: only row 0 is on the greedy path
        runner.rollback(length + 1)
        tokens.append(int(logits[0].argmax()))
    return tokens


PROMPT = [1, 502, 33, 9001, 77, 4, 1200, 18, 65, 3000]


def test_causal_mask_rows():
    mask = causal_mask(torch.tensor([2, 3]), 5)
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, True, False]]


@pytest.mark.parametrize("chunk", [4, 32])
def test_eager_fast_path_matches_transformers(make_tiny, chunk):
    loaded = make_tiny(seed=3)
    reference = replay(ModelRunner(loaded.model), PROMPT)
    fast = FastRunner(loaded.model, compiled="off", prefill_chunk=chunk)
    assert fast.notice == "" and not fast.is_compiled
    for expected, actual in zip(reference, replay(fast, PROMPT), strict=True):
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
    assert greedy(fast, PROMPT) == greedy(ModelRunner(loaded.model), PROMPT)


def test_a_prompt_runs_the_lm_head_on_its_last_position_only(make_tiny, monkeypatch):
    """Over a prompt the LM head would be 40 % of the work, for logits nobody reads."""
    from engine.runtime import row_linear

    loaded = make_tiny(seed=6)
    fast = FastRunner(loaded.model, compiled="off")
    head_rows, project = [], row_linear.project

    def recording(module, x, path):
        if module is fast.fast.lm_head:
            head_rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return project(module, x, path)

    monkeypatch.setattr(row_linear, "project", recording)
    last = fast.prefill(PROMPT)
    assert head_rows == [1]
    fast.rollback(0)
    every = fast.forward(PROMPT)
    assert head_rows == [1, len(PROMPT)]
    torch.testing.assert_close(last, every[-1], atol=1e-5, rtol=1e-5)


def test_fused_projections_are_the_models_own_weights(make_tiny):
    """Fusing q/k/v and gate/up adds no memory and leaves the model's own forward as it was."""
    loaded = make_tiny(seed=5)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        before = loaded.model(ids).logits
    first = FastRunner(loaded.model, compiled="off")
    assert first.fast.unfused_reason is None and first.fast.fused is not None
    layer, fused = loaded.model.model.layers[0], first.fast.fused[0]
    attn = layer.self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == fused.qkv_weight.untyped_storage().data_ptr()
    assert attn.v_proj.weight.data_ptr() == fused.qkv_weight[-attn.v_proj.out_features].data_ptr()
    assert (
        layer.mlp.up_proj.weight.data_ptr()
        == fused.gate_up_weight[layer.mlp.gate_proj.out_features].data_ptr()
    )
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(ids).logits, before, atol=0, rtol=0)
    second = FastRunner(loaded.model, compiled="off")  # a second runner reuses the fused weights
    assert second.fast.fused[0].qkv_weight.data_ptr() == fused.qkv_weight.data_ptr()
    assert greedy(second, PROMPT) == greedy(first, PROMPT) == greedy(ModelRunner(loaded.model), PROMPT)


def test_rollback_is_free_and_stale_slots_are_masked(make_tiny):
    loaded = make_tiny(seed=4)
    fast = FastRunner(loaded.model, compiled="off")
    fast.prefill(PROMPT)
    after_prompt = fast.forward([42])
    fast.rollback(len(PROMPT))
    fast.forward([999, 998, 997, 996])  # fills slots that the next forward must not see
    fast.rollback(len(PROMPT))
    torch.testing.assert_close(fast.forward([42]), after_prompt, atol=0, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_families(builtin_tokenizer, family):
    """Qwen2's q/k/v biases run fused; Qwen3's per-head q/k norms run on the model's own modules."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    config = (Qwen2Config if family == "qwen2" else Qwen3Config)(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=len(builtin_tokenizer),
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        attn = model.model.layers[0].self_attn
        (attn.q_proj.bias if family == "qwen2" else attn.q_norm.weight).normal_()
    reference = replay(ModelRunner(model), PROMPT)
    fast = FastRunner(model, compiled="off")
    assert (fast.fast.fused is None) == (family == "qwen3"), fast.fast.unfused_reason
    for expected, actual in zip(reference, replay(fast, PROMPT), strict=True):
        torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)


def test_unsupported_model_type_is_refused(make_tiny):
    loaded = make_tiny()
    loaded.model.config.model_type = "gemma3_text"
    try:
        with pytest.raises(ValueError, match="gemma3_text"):
            FastRunner(loaded.model)
    finally:
        loaded.model.config.model_type = "llama"


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic-shapes", "fixed-sizes"])
def test_compiled_shapes_match_eager(make_tiny, monkeypatch, dynamic):
    """Traced and functionalized as inductor sees it (aot_eager keeps the test fast): one graph for
    every length (CPU), or fixed sizes with padding (CUDA graphs); features; mutation."""
    real_compile = torch.compile
    monkeypatch.setattr(
        torch,
        "compile",
        lambda module, **kwargs: real_compile(
            module, backend="aot_eager", dynamic=kwargs["dynamic"], fullgraph=True
        ),
    )
    loaded = make_tiny(seed=5)
    eager = FastRunner(loaded.model, compiled="off", prefill_chunk=8)
    compiled = FastRunner(
        loaded.model, compiled="auto", prefill_chunk=8, verify_sizes=(4,), dynamic_shapes=dynamic
    )
    stages = []
    compiled.warm_up(progress=lambda stage, done, total: stages.append((done, total)), captures=[(), (1, 2)])
    assert compiled.is_compiled, compiled.notice
    graphs = 2 if dynamic else 3  # one token and several; or sizes 1, 4 and 8 (the prefill chunk)
    assert stages[0] == (0, 2 * graphs) and stages[-1] == (2 * graphs, 2 * graphs)
    assert set(compiled.compile_seconds) == ({1, 2} if dynamic else {1, 4, 8})

    for expected, actual in zip(replay(eager, PROMPT), replay(compiled, PROMPT), strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert compiled.is_compiled, compiled.notice
    assert greedy(compiled, PROMPT) == greedy(eager, PROMPT) == greedy(ModelRunner(loaded.model), PROMPT)
    assert greedy_verify(compiled, PROMPT, k=3) == greedy(eager, PROMPT)
    for runner in (eager, compiled):  # the features a draft head reads come from the compiled graph too
        runner.capture_hidden = (1, 2)
        runner.reset()
        runner.prefill(PROMPT)
        runner.forward([5, 6, 7, 8])
    torch.testing.assert_close(compiled.last_hidden[1], eager.last_hidden[1], atol=1e-5, rtol=1e-4)
    assert compiled.last_hidden[0] == eager.last_hidden[0] == len(PROMPT)


def test_token_trees_run_on_the_compiled_graph_without_compiling_again(make_tiny, monkeypatch):
    """Every tree size and depth runs on the one tree graph warm_up(trees=True) built, with the eager
    tree's logits; a compiled runner without that graph verifies no trees."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda module, **kwargs: real_compile(module, backend="aot_eager", dynamic=True)
    )
    loaded = make_tiny(seed=5)
    eager, compiled = FastRunner(loaded.model, compiled="off"), FastRunner(loaded.model, compiled="auto")
    compiled.warm_up()
    assert compiled.is_compiled and not compiled.supports_trees and eager.supports_trees
    compiled.warm_up(trees=True)
    assert compiled.is_compiled and compiled.supports_trees and TREE in compiled.compile_seconds
    graphs = counters["stats"]["unique_graphs"]
    on_graph = []
    call_tree = compiled._call_compiled_tree
    compiled._call_compiled_tree = lambda *args: on_graph.append(call_tree(*args)) or on_graph[-1]
    trees = ([-1, 0, 0], [-1, 0, 1, 0], [-1, 0, 1, 2, 0, 4, 1])
    for runner in (eager, compiled):
        runner.reset()
        runner.prefill(PROMPT)
    for parents in trees:
        ids = torch.arange(len(parents)) + 40
        for runner in (eager, compiled):
            runner.rollback(len(PROMPT))
        expected, actual = eager.forward_tree(ids, parents), compiled.forward_tree(ids, parents)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert compiled.is_compiled, compiled.notice
    assert len(on_graph) == len(trees) and None not in on_graph
    assert counters["stats"]["unique_graphs"] == graphs


def test_an_eager_runner_compiles_later_and_keeps_its_cache(make_tiny, monkeypatch):
    """compile_now mid-conversation (how ChatEngine switches once the compiled path is built): the
    cached context stays, and the logits are the eager ones."""
    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda module, **kwargs: real_compile(module, backend="aot_eager", dynamic=True)
    )
    loaded = make_tiny(seed=5)
    runner = FastRunner(loaded.model, compiled="off")
    reference = FastRunner(loaded.model, compiled="off")
    rows = [runner.prefill(PROMPT)]
    tokens = [int(rows[-1].argmax())]
    for _ in range(5):
        rows.append(runner.forward([tokens[-1]])[-1])
        tokens.append(int(rows[-1].argmax()))
    assert not runner.is_compiled
    assert runner.compile_now() and runner.is_compiled and runner.compile_seconds.keys() == {1, 2}
    for _ in range(8):
        rows.append(runner.forward([tokens[-1]])[-1])
        tokens.append(int(rows[-1].argmax()))
    expected = [reference.prefill(PROMPT)] + [reference.forward([t])[-1] for t in tokens[:-1]]
    torch.testing.assert_close(torch.stack(rows), torch.stack(expected), atol=1e-5, rtol=1e-4)


def test_compile_unavailable_falls_back_with_notice(make_tiny, monkeypatch):
    loaded = make_tiny(seed=6)

    def refuse(*args, **kwargs):
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(torch, "compile", refuse)
    fast = FastRunner(loaded.model, compiled="auto")
    assert not fast.is_compiled and "compiler exploded" in fast.notice
    assert greedy(fast, PROMPT) == greedy(ModelRunner(loaded.model), PROMPT)


def test_compile_failing_at_first_call_falls_back_with_notice(make_tiny, monkeypatch):
    loaded = make_tiny(seed=6)

    def broken(*args, **kwargs):
        raise RuntimeError("C++ compile failed")

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: broken)
    fast = FastRunner(loaded.model, compiled="auto")
    assert fast.is_compiled
    expected = greedy(ModelRunner(loaded.model), PROMPT)
    assert greedy(fast, PROMPT) == expected
    assert not fast.is_compiled and "C++ compile failed" in fast.notice


def test_no_compiler_or_env_off(make_tiny, monkeypatch):
    loaded = make_tiny(seed=6)
    monkeypatch.setattr("engine.runtime.compile_cache.shutil.which", lambda name: None)
    fast = FastRunner(loaded.model, compiled="auto")
    assert not fast.is_compiled and "C++ compiler" in fast.notice

    monkeypatch.setenv("TANDEM_COMPILE", "off")
    fast = FastRunner(loaded.model, compiled="auto")
    assert not fast.is_compiled


# Compiles a tiny model with inductor, checks it against eager, and reports how long compiling took.
CACHE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from engine.runtime.compile_cache import cache_hits
    from engine.runtime.fastpath import FastRunner

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    runner = FastRunner(model, prefill_chunk=8, compile_mode=sys.argv[1])
    begun = time.perf_counter()
    runner.warm_up([1])
    seconds = time.perf_counter() - begun
    eager = FastRunner(model, compiled="off")
    prompt = [1, 5, 9, 200, 31, 7]
    same, worst = [], 0.0
    for r in (runner, eager):
        r.prefill(prompt)
    token = 3
    for _ in range(12):
        a, b = runner.forward([token])[-1], eager.forward([token])[-1]
        worst = max(worst, (a - b).abs().max().item())
        same.append(int(a.argmax()) == int(b.argmax()))
        token = int(b.argmax())
    print(json.dumps({"seconds": seconds, "compiled": runner.is_compiled, "notice": runner.notice,
                      "same_greedy": all(same), "max_diff": worst, **cache_hits()}))
    """
)


@pytest.mark.slow
def test_inductor_matches_eager_and_its_cache_is_reused(tmp_path):
    """Real inductor kernels: decode equals eager; a second process with the same cache reads every graph
    back from it instead of compiling (how long each took is in the runs, not asserted)."""
    from test_compile_build import run_json_script

    # "default": the mode the CPU fast path compiles in
    runs = [run_json_script(CACHE_SCRIPT, "default", cache=tmp_path, timeout=600) for _ in range(2)]
    first, second = runs
    for run in runs:
        assert run["compiled"] and run["notice"] == "", run
        assert run["same_greedy"] and run["max_diff"] < 1e-4, run
    assert first["miss"] > 0 and first["hit"] == 0, runs
    assert second["hit"] == first["miss"] and second["miss"] == 0, runs
    assert any((tmp_path / "inductor").iterdir())


def test_quantized_draft_runs_eagerly_with_notice(make_tiny):
    import copy

    loaded = make_tiny(seed=7)
    quantized = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(loaded.model), {torch.nn.Linear}, dtype=torch.qint8
    )
    fast = FastRunner(quantized, compiled="auto")
    assert not fast.is_compiled and "quantized" in fast.notice
    assert fast.fast.fused is None and "quantized" in fast.fast.unfused_reason
    # Activations are quantized with one scale per call over all its rows, and transformers runs the
    # head on the last prompt row only: compare on average rather than element by element.
    reference = replay(ModelRunner(quantized), PROMPT)
    for expected, actual in zip(reference, replay(fast, PROMPT), strict=True):
        assert (actual - expected).abs().mean() < 0.05 * expected.abs().mean()


def test_static_buffers_hold_the_models_whole_context_up_to_the_default(make_tiny):
    """A conversation past 2048 tokens runs on the fast path, as far as the model's own context when
    that is shorter than the default context; a longer one gets the default, not its own maximum."""
    from engine.settings import DEFAULT_CONTEXT_TOKENS, cache_tokens_for

    loaded = make_tiny(seed=5)
    loaded.model.config.max_position_embeddings = 4096
    fast = FastRunner(loaded.model, compiled="off")
    assert fast.context_length == 4096
    long_prompt = [(17 * i) % 4000 + 5 for i in range(3000)]
    assert greedy(fast, long_prompt, steps=4) == greedy(ModelRunner(loaded.model), long_prompt, steps=4)
    loaded.model.config.max_position_embeddings = 10**9
    assert cache_tokens_for(loaded.model.config) == DEFAULT_CONTEXT_TOKENS
