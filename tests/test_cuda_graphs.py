"""CUDA graphs captured from the eager forward (engine.runtime.cuda_graphs): the eager forward's
logits and tokens, one graph per shape. The size and window rules run anywhere; the graphs need an
NVIDIA GPU. Self-contained (no conftest fixtures), so it runs on a bare GPU machine with
`pytest --noconftest tests/test_cuda_graphs.py`."""

from __future__ import annotations

import pytest
import torch

from engine.bench.random_pair import build_model
from engine.bench.synthetic import generate_with
from engine.decoding.drafters.model import ModelDrafter
from engine.runtime.cuda_graphs import GRAPHED_TOKENS, SMALLEST_WINDOW, graph_size, graph_window
from engine.runtime.fastpath import FastRunner

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU")
PROMPT = list(range(100, 140))


def test_graph_windows_grow_in_powers_of_two_up_to_the_buffer():
    assert graph_window(1, 4096) == SMALLEST_WINDOW
    assert graph_window(SMALLEST_WINDOW, 4096) == SMALLEST_WINDOW
    assert graph_window(SMALLEST_WINDOW + 1, 4096) == 2 * SMALLEST_WINDOW
    assert graph_window(3000, 4096) == 4096
    assert graph_window(3000, 3500) == 3500


def test_each_verify_size_has_its_own_graph_and_prompts_share_the_chunks():
    assert [graph_size(n, 32) for n in (1, 5, GRAPHED_TOKENS)] == [1, 5, GRAPHED_TOKENS]
    assert graph_size(GRAPHED_TOKENS + 1, 32) == 32


def runners():
    model = build_model("tiny", torch.device("cuda"), torch.float32, seed=0)
    graphed = FastRunner(model, torch.device("cuda"), 1024, compiled="auto")
    eager = FastRunner(model, torch.device("cuda"), 1024, compiled="off")
    assert graphed.graphed and not eager.is_compiled
    return model, graphed, eager


@cuda
def test_graphed_forwards_give_the_eager_logits_for_prompts_chains_and_trees():
    _, graphed, eager = runners()
    first = [runner.prefill(PROMPT) for runner in (graphed, eager)]
    torch.testing.assert_close(first[0], first[1], atol=1e-4, rtol=1e-4)
    start = graphed.cache_length
    for n in range(1, 9):
        ids = torch.arange(200, 200 + n)
        rows = [runner.forward(ids) for runner in (graphed, eager)]
        torch.testing.assert_close(rows[0], rows[1], atol=1e-4, rtol=1e-4)
        graphed.rollback(start)
        eager.rollback(start)
    parents = [-1, 0, 0, 1, 2]
    trees = [runner.forward_tree(torch.arange(300, 305), parents) for runner in (graphed, eager)]
    torch.testing.assert_close(trees[0], trees[1], atol=1e-4, rtol=1e-4)
    graphs = len(graphed._compiled.graphs)
    for _ in range(3):  # the same shapes again: replays, no new captures
        graphed.rollback(start)
        graphed.forward(torch.arange(200, 204))
    assert len(graphed._compiled.graphs) == graphs


@cuda
def test_graphed_decoding_and_drafting_keep_the_eager_targets_tokens():
    model, graphed, eager = runners()
    plain, _ = generate_with(eager, None, PROMPT, 48, 0)
    assert generate_with(graphed, None, PROMPT, 48, 0)[0] == plain
    drafter = ModelDrafter(FastRunner(model, torch.device("cuda"), 1024), model.config.vocab_size, "self")
    drafted, stats = generate_with(graphed, drafter, PROMPT, 48, 3)
    assert drafted == plain
    assert stats.accepted > 0.9 * stats.drafted
