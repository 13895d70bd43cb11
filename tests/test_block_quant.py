"""The block-quantized kernels (engine.kernels.block_quant): every code path this CPU runs against the
arithmetic it claims, a GGUF Q4_1 block held exactly, fused projections, and the compiled forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import block_quant as bq
from engine.kernels import quant_kernels as qk
from engine.kernels.cpu_features import has_avx2
from engine.runtime import static_forward
from engine.runtime.attention import rows_unavailable_reason
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner
from tests.test_fastpath import greedy

PATHS = ["portable"] + (["avx2"] if has_avx2() else [])
PATHS += ["vnni"] if bq.best_path() == "vnni" else []


@pytest.fixture(scope="module", autouse=True)
def built():
    assert bq.build_error() is None, bq.build_error()


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float: activations rounded to INT8 blocks of 32, times `weight`."""
    blocks = x.reshape(x.shape[0], -1, bq.BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.round(blocks / scale.clamp(min=1e-30)).clamp(-127, 127)
    return F.linear((q * scale).reshape(x.shape), weight)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("path", PATHS)
def test_each_code_path_computes_the_block_arithmetic(bits, path):
    torch.manual_seed(bits)
    weight = torch.randn(70, 192) * 0.05  # 70 rows: the four-row loop's tail runs too
    x = torch.randn(3, 192)
    x[1, :32] = 0  # an all-zero block
    qweight, scales, mins = bq.quantize_blocks(weight, bits)
    held = bq.dequantize_blocks(qweight, scales, mins, bits)
    y = torch.ops.tandem_block_quant.linear(x, qweight, scales, mins, bits, path)
    torch.testing.assert_close(y, reference(x, held), atol=2e-5, rtol=1e-5)
    # a prompt's many rows take the float GEMM on the same weights
    many = torch.randn(bq.INTEGER_ROWS + 1, 192)
    y = torch.ops.tandem_block_quant.linear(many, qweight, scales, mins, bits, path)
    torch.testing.assert_close(y, F.linear(many, held), atol=2e-5, rtol=1e-5)
    # each path turns the blocks back into the same floats (d * q, then + m) for that GEMM
    portable = torch.ops.tandem_block_quant.linear(many, qweight, scales, mins, bits, "portable")
    assert torch.equal(y, portable)
    # and the blocks are a fair copy of the float weight
    assert (held - weight).abs().max() < (0.02 if bits == 4 else 0.002)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("path", PATHS)
def test_each_row_is_the_same_whatever_the_number_of_rows(bits, path):
    """A verify forward's rows must be bit for bit the one-token steps: the code paths take weight
    rows and activation rows in tiles of several, and no tiling may change a row's result."""
    torch.manual_seed(3 + bits)
    weight = torch.randn(70, 192) * 0.05
    qweight, scales, mins = bq.quantize_blocks(weight, bits)
    x = torch.randn(9, 192)
    alone = torch.cat(
        [
            torch.ops.tandem_block_quant.linear(x[i : i + 1], qweight, scales, mins, bits, path)
            for i in range(9)
        ]
    )
    for rows in range(2, 10):
        together = torch.ops.tandem_block_quant.linear(x[:rows], qweight, scales, mins, bits, path)
        assert torch.equal(together, alone[:rows]), f"{rows} rows"


def test_a_gguf_q4_1_block_is_held_exactly():
    """w = d·q + m with q spanning 0..15 in each block, as a Q4_1 file holds it: the same numbers back."""
    torch.manual_seed(1)
    n, k = 8, 128
    q = torch.randint(0, 16, (n, k // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15
    d = torch.rand(n, k // 32, 1) * 0.01 + 1e-3
    m = torch.randn(n, k // 32, 1) * 0.05
    weight = (q * d + m).reshape(n, k)
    held = bq.dequantize_blocks(*bq.quantize_blocks(weight, 4), bits=4)
    torch.testing.assert_close(held, weight, atol=1e-6, rtol=0)


def test_fused_projections_compute_what_the_layers_do():
    torch.manual_seed(2)
    layers = [bq.BlockQuantLinear.quantized(torch.randn(n, 128) * 0.05, None, 4) for n in (64, 32, 32)]
    x = torch.randn(2, 5, 128)
    separate = torch.cat([layer(x) for layer in layers], dim=-1)
    fused = bq.concatenated(layers)
    torch.testing.assert_close(fused(x), separate)
    assert bq.shares_buffers(layers, fused)  # the layers now read slices of the fused weights
    torch.testing.assert_close(torch.cat([layer(x) for layer in layers], dim=-1), separate)


def test_a_layer_whose_width_is_not_a_multiple_of_64_stays_float():
    make = qk.KERNELS["int4-block-q4_1"].make_linear
    weight = torch.randn(16, 40)
    layer = make(weight, None)
    assert type(layer) is torch.nn.Linear and torch.equal(layer.weight, weight)
    assert type(make(torch.randn(16, 64), None)) is bq.BlockQuantLinear


def tiny_quantized(kernel: str, tokenizer):
    from tests.tiny_models import build_tiny_llama

    return qk.KERNELS[kernel].build(build_tiny_llama(tokenizer, seed=3, hidden=128, vocab_size=512))


PROMPT = [5, 17, 99, 3, 250, 41, 7, 300, 12]


@pytest.mark.parametrize("kernel", ["int4-block-q4_1", "int8-block-q8_0"])
def test_the_fast_path_fuses_block_quantized_layers_and_matches_the_model(kernel, builtin_tokenizer):
    model = tiny_quantized(kernel, builtin_tokenizer)
    assert type(model.lm_head) is bq.BlockQuantLinear and model.lm_head.bits == 8
    fast = FastRunner(model, compiled="off")
    assert fast.fast.fused is not None, fast.fast.unfused_reason
    assert fast.fast.fused[0].qkv_quant is not None
    slow = ModelRunner(model)
    torch.testing.assert_close(fast.prefill(PROMPT), slow.prefill(PROMPT), atol=1e-4, rtol=1e-4)
    assert greedy(fast, PROMPT) == greedy(slow, PROMPT)


def test_the_compiled_forward_calls_the_kernel_and_gives_the_eager_tokens(monkeypatch, builtin_tokenizer):
    monkeypatch.delenv("TANDEM_COMPILE", raising=False)  # the suite's default is off
    real_compile = torch.compile
    monkeypatch.setattr(
        torch,
        "compile",
        lambda module, **kwargs: real_compile(
            module, backend="aot_eager", dynamic=kwargs["dynamic"], fullgraph=True
        ),
    )
    model = tiny_quantized("int4-block-q4_1", builtin_tokenizer)
    eager = FastRunner(model, compiled="off", prefill_chunk=8)
    compiled = FastRunner(model, compiled="auto", prefill_chunk=8, verify_sizes=(4,), dynamic_shapes=True)
    compiled.warm_up()
    assert compiled.is_compiled, compiled.notice
    assert greedy(compiled, PROMPT) == greedy(eager, PROMPT)


# 12 tokens: on some CPUs one SDPA call over up to 5 rows rounds as its single rows do, not over 12
NEW = [40, 8, 311, 77, 150, 23, 402, 9, 61, 288, 5, 130]


def verify_and_steps(runner, new: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of one verify forward over `new` after PROMPT, and of one-token steps over the same tokens."""
    runner.reset()
    runner.prefill(PROMPT)
    start = runner.cache_length
    together = runner.forward(new).clone()
    runner.rollback(start)
    alone = torch.stack([runner.forward([token]).clone()[0] for token in new])
    return together, alone


# the row attention kernel runs wherever the CPU has AVX2: there, a kernel that did not build fails
AVX2 = has_avx2()


def sdpa_attention(monkeypatch):
    """Runners built after this attend with SDPA, as where the row attention kernel cannot run."""
    monkeypatch.setattr(static_forward, "rows_kernel_for", lambda *args: False)


@pytest.mark.parametrize("attention", ["row kernel", "sdpa row by row"])
def test_verify_rows_of_a_block_quantized_target_are_its_one_token_steps_bit_for_bit(
    attention, monkeypatch, builtin_tokenizer
):
    """Activations rounded to integers turn a verify forward's tiny float differences into other
    tokens; attention row by row keeps every row the one-token step's own result."""
    if attention == "row kernel":
        if not AVX2:
            pytest.skip("this CPU has no AVX2, where the row attention kernel runs")
        assert rows_unavailable_reason() is None, rows_unavailable_reason()
    else:
        sdpa_attention(monkeypatch)
    runner = FastRunner(tiny_quantized("int4-block-q4_1", builtin_tokenizer), compiled="off")
    assert runner.exact_verify
    assert runner.supports_trees == (attention == "row kernel")  # SDPA rounds a tree's masked rows apart
    for n in (2, 3, 5, 12):
        together, alone = verify_and_steps(runner, NEW[:n])
        assert torch.equal(together, alone), n
    # the negative control: one masked SDPA call for all rows
    runner.fast.row_attention, runner.row_by_row = False, False
    together, alone = verify_and_steps(runner, NEW)
    assert not torch.equal(together, alone)
    assert not FastRunner(
        tiny_quantized("int8-dynamic-plain", builtin_tokenizer), compiled="off"
    ).exact_verify


@pytest.mark.skipif(not AVX2, reason="this CPU has no AVX2, where the row attention kernel runs")
def test_a_token_trees_rows_are_the_one_token_steps_along_each_path(builtin_tokenizer):
    """Under the row attention kernel a tree node's logits are bit for bit those of one-token steps
    over its path, so trees stay exact on a target that rounds activations."""
    runner = FastRunner(tiny_quantized("int4-block-q4_1", builtin_tokenizer), compiled="off")
    assert runner.fast.row_attention, rows_unavailable_reason()
    ids, parents = [PROMPT[-1], 40, 8, 311, 77], [-1, 0, 0, 2, 1]
    runner.prefill(PROMPT[:-1])
    start = runner.cache_length
    tree = runner.forward_tree(ids, parents).clone()
    for path in ([0, 2, 3], [0, 1, 4]):
        runner.rollback(start)
        steps = torch.stack([runner.forward([ids[node]]).clone()[0] for node in path])
        assert torch.equal(tree[path], steps), path
    runner.rollback(start)  # the negative control: a masked SDPA call
    runner.fast.row_attention = False
    sdpa_tree = runner.forward_tree(ids, parents)
    assert not torch.equal(sdpa_tree, tree)


def compiled_verify_runner(monkeypatch, builtin_tokenizer) -> FastRunner:
    """A compiled (aot_eager, dynamic shapes) runner on a tiny INT4 target, verify size 3 requested."""
    model = tiny_quantized("int4-block-q4_1", builtin_tokenizer)
    monkeypatch.delenv("TANDEM_COMPILE", raising=False)  # the suite's default is off
    real_compile = torch.compile
    monkeypatch.setattr(
        torch,
        "compile",
        lambda module, **kwargs: real_compile(module, backend="aot_eager", dynamic=True, fullgraph=True),
    )
    runner = FastRunner(model, compiled="auto", prefill_chunk=8, verify_sizes=(3,), dynamic_shapes=True)
    runner.warm_up()
    assert runner.is_compiled, runner.notice
    return runner


def test_compiled_verify_sizes_pad_to_a_built_graph_and_cap_the_draft(monkeypatch, builtin_tokenizer):
    """Without the row attention kernel a compiled forward verifies in graphs of fixed sizes."""
    sdpa_attention(monkeypatch)
    runner = compiled_verify_runner(monkeypatch, builtin_tokenizer)
    assert runner.exact_sizes == [3] and runner.verify_limit == 3
    for n in (2, 3):  # 2 runs in the 3-token graph, its padding row after the real ones
        together, alone = verify_and_steps(runner, NEW[:n])
        assert torch.equal(together, alone), n


@pytest.mark.skipif(not AVX2, reason="this CPU has no AVX2, where the row attention kernel runs")
def test_a_compiled_forward_on_the_row_kernel_verifies_any_size_exactly(monkeypatch, builtin_tokenizer):
    runner = compiled_verify_runner(monkeypatch, builtin_tokenizer)
    assert runner.fast.row_attention, rows_unavailable_reason()
    assert runner.exact_sizes == [3] and runner.verify_limit is None  # no graph per verify size
    for n in (2, 3, 5):
        together, alone = verify_and_steps(runner, NEW[:n])
        assert torch.equal(together, alone), n


@pytest.mark.skipif(not AVX2, reason="this CPU has no AVX2, where the row attention kernel runs")
def test_a_compiled_runner_verifies_token_trees_on_its_own_graph(monkeypatch, builtin_tokenizer):
    """A tree verified by the uncompiled forward rounds apart from the compiled one-token steps (on
    the built-in INT4 target, greedy output left the target's own on 5 of 9 bench prompts when every
    round was a tree); on the compiled tree graph each node is the compiled steps' result."""
    runner = compiled_verify_runner(monkeypatch, builtin_tokenizer)
    assert not runner.supports_trees  # until its tree graph is built
    runner.warm_up(trees=True)
    on_graph = []
    call_tree = runner._call_compiled_tree
    runner._call_compiled_tree = lambda *args: on_graph.append(call_tree(*args)) or on_graph[-1]
    ids, parents = [PROMPT[-1], 40, 8, 311, 77], [-1, 0, 0, 2, 1]
    runner.prefill(PROMPT[:-1])
    start = runner.cache_length
    tree = runner.forward_tree(ids, parents).clone()
    assert len(on_graph) == 1 and on_graph[0] is not None and runner.is_compiled, runner.notice
    for path in ([0, 2, 3], [0, 1, 4]):
        runner.rollback(start)
        steps = torch.stack([runner.forward([ids[node]]).clone()[0] for node in path])
        assert torch.equal(tree[path], steps), path


def block_quantized_target(make_tiny, kernel: str):
    from engine.models.loaded import LoadedModel

    tiny = make_tiny(seed=4, hidden=128)
    model = qk.KERNELS[kernel].build(tiny.model)
    # the info a checked quantization gives (engine.models.quantize.quantize_checked)
    info = {"kernel": kernel, "rounds_activations": qk.KERNELS[kernel].rounds_activations}
    return LoadedModel(tiny.spec, model, tiny.tokenizer, tiny.device, tiny.dtype, "int4", info=info)


def test_a_block_quantized_target_drafts_and_gives_its_own_greedy_tokens(make_tiny):
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    target = block_quantized_target(make_tiny, "int4-block-q4_1")
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=40)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8]  # a repeat the n-gram drafter drafts from
    fixed_k = SpeculationSettings(drafter="ngram", k=4)
    drafting = ChatEngine(target, None, speculation=fixed_k, sampling=sampling, compiled="off")
    plain = ChatEngine(
        target, None, speculation=SpeculationSettings(drafter="none"), sampling=sampling, compiled="off"
    )
    finished = drafting.generate_ids(prompt)
    assert finished.stats.drafted > 0 and "rounds activations" not in finished.stats.note
    assert finished.token_ids == plain.generate_ids(prompt).token_ids


def test_a_target_whose_verify_rows_round_apart_runs_alone_and_says_why(make_tiny):
    """torch.ao's dynamic INT8 rounds activations and is not row-exact: a verify forward and a
    one-token step could pick different tokens, so nothing is drafted for such a target."""
    from engine.session import ChatEngine
    from engine.settings import SpeculationSettings

    target = block_quantized_target(make_tiny, "int8-dynamic-plain")
    engine = ChatEngine(target, None, speculation=SpeculationSettings(drafter="ngram", k=4), compiled="off")
    finished = engine.generate_ids([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8])
    assert finished.stats.drafted == 0 and finished.stats.generated_tokens > 0
    assert "rounds activations" in finished.stats.note and "int8-dynamic-plain" in finished.stats.note


def test_no_draft_model_is_loaded_for_a_target_that_rounds_activations(builtin_folder):
    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.pair import load_pair

    target, draft = load_pair(DEFAULT_TARGET, None, device="cpu", target_precision="int4")
    # the block kernel wherever the CPU has AVX2; a weight-only INT4 kernel elsewhere keeps its draft
    assert (draft is None) == target.rounds_activations
    assert draft is None or target.info["kernel"] != "int4-block-q4_1"
