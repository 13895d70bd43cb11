"""Token trees: the tree forward against chains, the walk, greedy output and the sampled distribution."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.decoding.adaptive import KController
from engine.decoding.drafters import NgramDrafter, SuffixDrafter
from engine.decoding.drafters.base import Draft
from engine.decoding.planner import DraftPlanner
from engine.decoding.speculative import generate, speculative_round
from engine.decoding.tree import DraftTree, verify_tree, walk
from engine.decoding.verify_cost import VerifyCostCurve
from engine.runtime.eager import ModelRunner
from engine.runtime.fastpath import FastRunner
from engine.settings import SamplingSettings, SpeculationSettings
from tests.fake_drafters import EmptyDrafter
from tests.tiny_models import build_tiny_llama

CONTEXT = [5, 9, 1, 12, 7, 3]


def test_walk_follows_the_targets_choice_and_stops_at_the_first_miss():
    tree = DraftTree.chain([10, 11, 12])
    tree.add(20, -1)  # node 3: another first token
    tree.add(21, 3)  # node 4, under it
    choices = {0: 20, 4: 21, 5: 99}  # row = node + 1

    outcome = walk(tree, lambda row, depth: choices[row])
    assert outcome.accepted == [20, 21] and outcome.path == [3, 4] and outcome.next_token == 99
    assert walk(tree, lambda row, depth: 42).accepted == []
    assert tree.chain_length == 3 and tree.add(20, -1) is None  # one node per token under a parent


def test_a_tree_forward_gives_every_path_the_logits_of_its_chain(make_tiny):
    loaded = make_tiny(seed=7)
    tree = DraftTree.chain([40, 41, 42])
    tree.add_branch([50, 51], -1, budget=8)
    tree.add_branch([43], 0, budget=8)  # under node 0 (token 40)
    fast, chain = FastRunner(loaded.model, compiled="off"), FastRunner(loaded.model, compiled="off")
    fast.prefill(CONTEXT[:-1])
    logits = fast.forward_tree([CONTEXT[-1], *tree.tokens], [-1, *(p + 1 for p in tree.parents)])
    for path in ([0, 1, 2], [3, 4], [0, 5]):
        chain.reset()
        chain.prefill(CONTEXT[:-1])
        expected = chain.forward([CONTEXT[-1], *(tree.tokens[i] for i in path)])
        torch.testing.assert_close(logits[[0, *(i + 1 for i in path)]], expected, atol=2e-5, rtol=1e-4)

    # keeping a path that left the main branch leaves the cache as if that path had been fed as a chain
    fast.keep_path([0, 4, 5])  # rows of the root, node 3 (50) and node 4 (51)
    assert fast.cache_length == len(CONTEXT) + 2
    chain.reset()
    chain.prefill(CONTEXT + [50, 51])
    torch.testing.assert_close(fast.forward([60, 61]), chain.forward([60, 61]), atol=2e-5, rtol=1e-4)


def flat_planner(drafter, speculation) -> DraftPlanner:
    """A cost curve on which a forward over up to 17 tokens costs what one costs (as on a GPU)."""
    curve = VerifyCostCurve()
    curve.seconds = {n: 0.01 for n in (1, 2, 3, 4, 5, 9, 17)}
    return DraftPlanner([(drafter, KController(speculation, curve))], curve)


LISTS = (
    "Shopping list: red apples, green pears, ripe bananas. Second list: red apples, green grapes, "
    "ripe plums. Third list: red apples,"
)


@pytest.mark.parametrize("drafter_class", [NgramDrafter, SuffixDrafter])
def test_greedy_output_with_trees_is_the_targets(builtin_model, drafter_class):
    """Lookups over text that repeats with variations: trees hold the other occurrences, and the
    output stays the target's own greedy output token for token, with trees and without."""
    tokenizer, model = builtin_model.tokenizer, builtin_model.model
    prompt = tokenizer(LISTS)["input_ids"]
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=32)
    reference = ModelRunner(model)
    reference.reset()
    expected, token = [], int(reference.prefill(prompt).argmax())
    for _ in range(32):
        expected.append(token)
        token = int(reference.forward([token])[-1].argmax())

    vocab = model.config.vocab_size
    drafter = drafter_class(vocab, "cpu")
    speculation = SpeculationSettings(drafter="ngram", k=4)
    finished = generate(
        FastRunner(model, compiled="off"),
        flat_planner(drafter, speculation),
        prompt,
        sampling,
        speculation,
        set(),
        tokenizer,
    )
    assert list(finished.token_ids) == expected
    assert finished.stats.tree_rounds > 0 and finished.stats.tree_nodes >= finished.stats.tree_rounds

    untreed = generate(
        FastRunner(model, compiled="off"),
        flat_planner(drafter_class(vocab, "cpu"), SpeculationSettings(k=4, trees=False)),
        prompt,
        sampling,
        SpeculationSettings(drafter="ngram", k=4, trees=False),
        set(),
        tokenizer,
    )
    assert list(untreed.token_ids) == expected and untreed.stats.tree_rounds == 0


V_SMALL = 16


def emitted_pairs(runs: int, builtin_tokenizer, broken: bool = False):
    """`runs` tree rounds from one context at T = 0.7 (a tree of three first tokens, two with a second
    token under them): the first two emitted tokens of each round, and the target's exact
    distributions. `broken` walks into the first child whatever the target chose: a negative control."""
    model = build_tiny_llama(builtin_tokenizer, seed=4, layers=2, vocab_size=V_SMALL)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)  # soft: many tokens carry mass
    runner = FastRunner(model, compiled="off")
    sampling = SamplingSettings(temperature=0.7)
    generator = torch.Generator().manual_seed(3)
    tree = DraftTree.chain([2, 5])
    tree.add_branch([7, 1], -1, budget=8)
    tree.add(11, -1)

    def target_probs(ids):
        with torch.no_grad():
            return (model(input_ids=torch.tensor([ids])).logits[0, -1] / 0.7).softmax(-1).double()

    first = target_probs(CONTEXT)
    second = sum(first[d] * target_probs(CONTEXT + [d]) for d in range(V_SMALL))
    runner.prefill(CONTEXT[:-1])
    if broken:
        import engine.decoding.tree as tree_module

        real_walk = tree_module.walk
        tree_module.walk = lambda t, choose: real_walk(
            t, lambda row, depth: {0: 2, 1: 5}.get(row, choose(row, depth))
        )
    pairs = []
    try:
        for _ in range(runs):
            outcome, _ = verify_tree(runner, tree, CONTEXT, sampling, generator, None)
            emitted = outcome.accepted + [outcome.next_token]
            if len(emitted) < 2:  # the second token comes from the next round, from a plain step
                probs = (runner.forward([emitted[0]])[-1] / 0.7).softmax(-1)
                emitted.append(int(torch.multinomial(probs, 1, generator=generator)))
            pairs.append(emitted[:2])
            runner.rollback(len(CONTEXT) - 1)
    finally:
        if broken:
            tree_module.walk = real_walk
    pairs = torch.tensor(pairs)
    return pairs[:, 0], pairs[:, 1], first, second


def p_value(samples, probs) -> float:
    counts = torch.bincount(samples, minlength=V_SMALL).double()
    expected = probs * counts.sum()
    keep = expected > 0
    return chisquare(
        counts[keep].numpy(), (expected[keep] * counts[keep].sum() / expected[keep].sum()).numpy()
    ).pvalue


def test_sampling_through_a_tree_keeps_the_targets_distribution(builtin_tokenizer):
    first, second, exact_first, exact_second = emitted_pairs(3000, builtin_tokenizer)
    assert p_value(first, exact_first) > 1e-3 and p_value(second, exact_second) > 1e-3

    broken_first, _, _, _ = emitted_pairs(3000, builtin_tokenizer, broken=True)
    assert p_value(broken_first, exact_first) < 1e-3, "the test missed a walk that ignores the target"


def test_a_compiled_engine_builds_the_tree_graph_only_where_trees_get_room(make_tiny, monkeypatch):
    """The tree graph is one more graph to read back at every start: a compiled CPU engine builds it
    where the measured verify cost gives a tree room, and otherwise verifies chains only."""
    from engine.session import ChatEngine

    monkeypatch.delenv("TANDEM_COMPILE", raising=False)  # the suite's default is off
    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda module, **kwargs: real_compile(module, backend="aot_eager", dynamic=True)
    )
    # trees off while it prepares: the tiny model's own measured curve decides nothing here
    engine = ChatEngine(make_tiny(seed=5), None, SpeculationSettings(trees=False), compiled="on")
    engine.prepare()
    runner = engine._runner
    assert runner.is_compiled and runner.dynamic_shapes and not runner.tree_graph
    engine.speculation.trees = True
    for seconds, room in (
        ({1: 0.010, 2: 0.011, 3: 0.013, 5: 0.016}, False),
        ({1: 0.010, 2: 0.010, 3: 0.010}, True),
    ):
        engine._verify_curve.seconds = seconds
        engine.compiling.add_tree_graph()
        assert runner.tree_graph == runner.supports_trees == room
    finished = engine.generate_ids([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8])
    assert finished.stats.generated_tokens > 0 and runner.is_compiled


def test_an_engine_ready_before_its_tree_graph_builds_it_when_asked(make_tiny, monkeypatch):
    """The app says "Ready" without the tree graph (tree_graph_later: reading it back made a 10 s start
    13 s), then asks for it with build_tree_graph."""
    from engine.session import ChatEngine

    monkeypatch.delenv("TANDEM_COMPILE", raising=False)
    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda module, **kwargs: real_compile(module, backend="aot_eager", dynamic=True)
    )
    monkeypatch.setattr(VerifyCostCurve, "widest_at_cost", lambda self, n, limit: 3)  # trees have room
    engine = ChatEngine(make_tiny(seed=5), None, SpeculationSettings(trees=True), compiled="on")
    engine.tree_graph_later = True
    engine.prepare()
    runner = engine._runner
    assert runner.is_compiled and not runner.tree_graph
    stages = []
    assert engine.build_tree_graph(lambda stage, done, total: stages.append(done))
    assert runner.tree_graph and runner.supports_trees and stages
    finished = engine.generate_ids([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8])
    assert finished.stats.generated_tokens > 0


class FixedTreeDrafter(EmptyDrafter):
    """Proposes a fixed chain, and one fixed side node under the root in its tree."""

    name = "fixed"

    def __init__(self, chain: list[int], side: int):
        self.chain, self.side = chain, side

    def propose(self, context, k):
        return Draft(torch.tensor(self.chain[:k]), None)

    def tree(self, context, draft, budget):
        tree = DraftTree.chain(draft)
        tree.add(self.side, -1)
        return tree


def test_a_tree_round_tells_the_chains_acceptance_apart_from_a_side_nodes(make_tiny):
    """A side node kept where the chain failed is one more token, but not an accepted draft token: the
    acceptance model measures the chain, and the side node's own record (side_chance) says whether
    one stood where the chain failed."""
    loaded = make_tiny(seed=7)
    runner = FastRunner(loaded.model, compiled="off")
    runner.prefill(CONTEXT[:-1])
    first = int(runner.forward([CONTEXT[-1]])[-1].argmax())
    second = int(runner.forward([first])[-1].argmax())
    wrong = [t for t in range(3, 60) if t not in (first, second)]
    greedy = SamplingSettings(temperature=0.0)

    def round_with(drafter):
        runner.reset()
        runner.prefill(CONTEXT[:-1])
        return speculative_round(
            runner, drafter, CONTEXT, 2, greedy, torch.Generator(), None, tree_room=lambda drafted: 4
        )

    saved = round_with(FixedTreeDrafter([wrong[0], wrong[1]], side=first))
    assert saved.tokens == [first, second] and saved.num_accepted == 1
    assert saved.off_chain and saved.side_chance and saved.chain_accepted == 0 and saved.tree_nodes == 1
    beyond = round_with(
        FixedTreeDrafter([first, wrong[0]], side=wrong[1])
    )  # fails at depth 1: no side node there
    assert beyond.tokens == [first, second] and beyond.chain_accepted == 1
    assert not beyond.off_chain and not beyond.side_chance
    missed = round_with(FixedTreeDrafter([wrong[0], wrong[1]], side=wrong[2]))
    assert missed.side_chance and not missed.off_chain and missed.tokens == [first]


def test_sampling_verifies_chains_and_greedy_decoding_trees(builtin_model):
    """A tree's nodes are fixed tokens that the target's own sample must hit: unseeded sampling checks
    a chain by rejection sampling instead, which keeps more. Seeded sampling could use trees, but
    measured slower with them on a CPU, so sampled replies verify chains; greedy ones get trees."""
    tokenizer, model = builtin_model.tokenizer, builtin_model.model
    prompt = tokenizer(LISTS)["input_ids"]
    speculation = SpeculationSettings(drafter="ngram", k=4)
    rounds = {}
    for temperature, seed in ((0.7, None), (0.7, 3), (0.0, None)):
        drafter = NgramDrafter(model.config.vocab_size, "cpu")
        finished = generate(
            FastRunner(model, compiled="off"),
            flat_planner(drafter, speculation),
            prompt,
            SamplingSettings(temperature=temperature, seed=seed, max_new_tokens=24),
            speculation,
            set(),
            tokenizer,
        )
        rounds[temperature, seed] = finished.stats.tree_rounds
    assert rounds[0.7, None] == 0 and rounds[0.7, 3] == 0 and rounds[0.0, None] > 0
