"""tandem-cli bench: prompt files, method expansion, aggregation, HF runners, table, JSON, plots."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from engine.bench import methods as bench_methods
from engine.bench import prompts as bench_prompts
from engine.bench import records as bench_records
from engine.bench import report as bench_report
from engine.bench import suite as bench_suite
from engine.errors import PromptFileError, SettingsError

REQUIRED_FIELDS = (
    "tokens_per_s",
    "speedup_vs_baseline",
    "acceptance_rate",
    "mean_accepted_length",
    "greedy_identical",
    "ttft_s",
)
CATEGORIES = {"chat", "coding", "math", "summarization", "qa", "translation", "extraction", "rag"}


def write_lines(tmp_path, lines: list[str]):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def good_line(question_id=1, category="chat", turns=("Hello?",)) -> str:
    return json.dumps({"question_id": question_id, "category": category, "turns": list(turns)})


# ---- prompt files ------------------------------------------------------------------------------


def test_loads_mt_bench_format_and_skips_blank_lines(tmp_path):
    path = write_lines(tmp_path, [good_line(81, "writing", ["a", "b"]), "", good_line("q2", "math"), "   "])
    prompts = bench_prompts.load_prompts(path)
    assert prompts == [
        bench_prompts.BenchPrompt(81, "writing", ("a", "b")),
        bench_prompts.BenchPrompt("q2", "math", ("Hello?",)),
    ]


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ('{"question_id": 2, "category": "chat", "turns": ["x"]', "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"question_id": 2, "category": "chat"}', "missing turns"),
        ('{"question_id": 2, "turns": ["x"]}', "missing category"),
        ('{"question_id": 2, "category": "chat", "turns": []}', "non-empty list"),
        ('{"question_id": 2, "category": "chat", "turns": "just a string"}', "non-empty list"),
        ('{"question_id": 2, "category": "chat", "turns": ["ok", 3]}', "every turn"),
        ('{"question_id": 2, "category": "", "turns": ["x"]}', "category must be"),
        ('{"question_id": null, "category": "chat", "turns": ["x"]}', "question_id must be"),
        ('{"question_id": 1, "category": "chat", "turns": ["x"]}', "already used on line 1"),
    ],
)
def test_malformed_line_is_refused_with_its_number(tmp_path, bad, why):
    path = write_lines(tmp_path, [good_line(1), "", bad, good_line(3)])
    with pytest.raises(PromptFileError) as caught:
        bench_prompts.load_prompts(path)
    message = str(caught.value)
    assert "line 3" in message
    assert why in message
    assert str(path) in message


def test_missing_and_empty_files_are_refused(tmp_path):
    with pytest.raises(PromptFileError, match="No prompt file"):
        bench_prompts.load_prompts(tmp_path / "absent.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PromptFileError, match="no prompts"):
        bench_prompts.load_prompts(empty)


def test_builtin_prompt_set_covers_the_categories():
    prompts = bench_prompts.load_prompts(bench_prompts.default_prompts_path())
    assert len(prompts) >= 40
    counts = Counter(p.category for p in prompts)
    assert set(counts) == CATEGORIES
    assert min(counts.values()) >= 4
    assert sum(len(p.turns) > 1 for p in prompts) >= 3
    assert len({p.question_id for p in prompts}) == len(prompts)
    for prompt in prompts:  # copy-heavy categories carry a real passage to copy from
        if prompt.category in ("summarization", "extraction", "rag"):
            assert len(prompt.turns[0]) > 300, prompt.question_id


def test_limit_takes_categories_in_turn_and_categories_filter():
    prompts = [bench_prompts.BenchPrompt(i, cat, ("x",)) for i, cat in enumerate("aaabbc")]
    assert [p.category for p in bench_prompts.select_prompts(prompts, limit=3)] == ["a", "b", "c"]
    assert [p.question_id for p in bench_prompts.select_prompts(prompts, limit=4)] == [0, 3, 5, 1]
    assert [p.question_id for p in bench_prompts.select_prompts(prompts, ["b"])] == [3, 4]
    assert len(bench_prompts.select_prompts(prompts, limit=100)) == 6
    with pytest.raises(SettingsError, match="No prompts in category z"):
        bench_prompts.select_prompts(prompts, ["z"])
    with pytest.raises(SettingsError):
        bench_prompts.select_prompts(prompts, limit=0)


def test_min_turns_keeps_the_multi_turn_questions():
    prompts = [
        bench_prompts.BenchPrompt(i, cat, ("x",) * turns)
        for i, (cat, turns) in enumerate([("a", 1), ("a", 2), ("b", 3), ("b", 1)])
    ]
    assert [p.question_id for p in bench_prompts.select_prompts(prompts, min_turns=2)] == [1, 2]
    assert [p.question_id for p in bench_prompts.select_prompts(prompts, ["b"], min_turns=2)] == [2]
    assert len(bench_prompts.select_prompts(prompts)) == 4
    with pytest.raises(SettingsError, match="No question has 4 turns; the longest has 3"):
        bench_prompts.select_prompts(prompts, min_turns=4)
    with pytest.raises(SettingsError, match="at least 1"):
        bench_prompts.select_prompts(prompts, min_turns=0)
    shipped = bench_prompts.load_prompts(bench_prompts.default_prompts_path())
    assert len(bench_prompts.select_prompts(shipped, min_turns=2)) >= 3


# ---- methods -----------------------------------------------------------------------------------


def test_k_sweep_names_one_tandem_method_per_k():
    ks = bench_methods.parse_k_values(["2", "4", "adaptive", "4"])
    assert ks == [2, 4, None]
    names = [m.name for m in bench_methods.expand_methods(["baseline", "tandem", "hf-plain"], ks)]
    assert names == ["baseline", "tandem[k=2]", "tandem[k=4]", "tandem[k=adaptive]", "hf-plain"]
    single = bench_methods.expand_methods(["tandem", "tandem-ngram"], [4])
    assert [(m.name, m.k) for m in single] == [("tandem", 4), ("tandem-ngram", 4)]
    assert bench_methods.parse_k_values(None) == [None]


def test_the_default_methods_hold_every_drafter_once(make_tiny):
    from types import SimpleNamespace

    from engine.cli.bench import chosen_method_kinds, without_missing_head

    def kinds(draft):
        return chosen_method_kinds(SimpleNamespace(methods=None, draft=draft))

    assert {"tandem", "tandem-ngram", "tandem-head", "tandem-auto", "hf-assisted"} <= set(kinds(None))
    assert "tandem-head" not in kinds("head") and "hf-assisted" not in kinds("head")  # `tandem` is the head
    defaults = bench_methods.expand_methods(kinds(None), [None])
    args = SimpleNamespace(methods=None)
    shipped = SimpleNamespace(name="smollm2-135m-instruct")  # the built-in target: its head ships
    assert without_missing_head(args, defaults, shipped) == defaults
    headless = [m.kind for m in without_missing_head(args, defaults, make_tiny(seed=3))]
    assert "tandem-head" not in headless and "tandem-auto" in headless
    asked = SimpleNamespace(methods="baseline,tandem-head")  # asked for by name: kept, refused later
    assert without_missing_head(asked, defaults, make_tiny(seed=3)) == defaults


@pytest.mark.parametrize("bad", [["0"], ["17"], ["fast"]])
def test_bad_k_is_refused(bad):
    with pytest.raises(SettingsError, match="--k"):
        bench_methods.parse_k_values(bad)


def test_unknown_method_is_refused():
    with pytest.raises(SettingsError, match="Unknown method vllm"):
        bench_methods.expand_methods(["baseline", "vllm"], [None])


# ---- aggregation on synthetic records ---------------------------------------------------------


def make_record(question_id, category, method, tokens, time_s, ttft_s, rounds=(), token_ids=None):
    tally = bench_records.Tally(
        calls=1, generated_tokens=tokens, time_s=time_s, ttft_sum_s=ttft_s, ttft_count=1
    )
    for drafted, accepted in rounds:
        tally.record_round(drafted, accepted)
    ids = token_ids if token_ids is not None else [[question_id] * tokens]
    return bench_records.PromptRecord(question_id, category, method, ids, tally)


def synthetic_report():
    methods = bench_methods.expand_methods(["baseline", "tandem", "hf-plain"], [2, None])
    records = [
        make_record(1, "chat", "baseline", 10, 2.0, 0.2),
        make_record(1, "chat", "tandem[k=2]", 10, 1.0, 0.3, [(2, 2), (2, 1), (2, 0)]),
        make_record(1, "chat", "tandem[k=adaptive]", 10, 1.6, 0.3, [(4, 4), (0, 0)]),
        make_record(1, "chat", "hf-plain", 10, 2.5, 0.25),
        make_record(2, "rag", "baseline", 20, 2.0, 0.4),
        make_record(2, "rag", "tandem[k=2]", 20, 1.0, 0.5, [(2, 2)] * 6, token_ids=[[9] * 20]),
        make_record(2, "rag", "tandem[k=adaptive]", 20, 0.8, 0.5, [(4, 3)] * 5),
        make_record(2, "rag", "hf-plain", 20, 4.0, 0.6),
    ]
    return bench_report.build_report({"max_new_tokens": 20}, records, methods, greedy=True)


def test_report_schema_is_filled():
    report = synthetic_report()
    assert set(report) == {"config", "methods", "prompts"}
    json.dumps(report)  # serializable as is
    for name, method in report["methods"].items():
        for key in REQUIRED_FIELDS:
            assert key in method, (name, key)
        assert set(method["by_category"]) == {"chat", "rag"}
        for category in method["by_category"].values():
            for key in REQUIRED_FIELDS:
                assert key in category
    assert len(report["prompts"]) == 2
    assert set(report["prompts"][0]["methods"]) == set(report["methods"])


def test_speedups_are_ratios_of_tokens_per_s():
    report = synthetic_report()
    methods = report["methods"]
    base, plain = methods["baseline"]["tokens_per_s"], methods["hf-plain"]["tokens_per_s"]
    assert base == pytest.approx(30 / 4.0)
    for method in methods.values():
        assert method["tokens_per_s"] == pytest.approx(method["generated_tokens"] / method["time_s"])
        assert method["speedup_vs_baseline"] == pytest.approx(method["tokens_per_s"] / base, rel=1e-12)
        assert method["speedup_vs_hf_plain"] == pytest.approx(method["tokens_per_s"] / plain, rel=1e-12)
        for category, numbers in method["by_category"].items():
            category_base = methods["baseline"]["by_category"][category]["tokens_per_s"]
            assert numbers["speedup_vs_baseline"] == pytest.approx(numbers["tokens_per_s"] / category_base)
    assert methods["tandem[k=2]"]["speedup_vs_baseline"] == pytest.approx(15 / 7.5)
    for prompt in report["prompts"]:
        prompt_base = prompt["methods"]["baseline"]["tokens_per_s"]
        for numbers in prompt["methods"].values():
            assert numbers["speedup_vs_baseline"] == pytest.approx(numbers["tokens_per_s"] / prompt_base)


def test_acceptance_identity_and_ttft():
    methods = synthetic_report()["methods"]
    k2 = methods["tandem[k=2]"]
    assert k2["acceptance_rate"] == pytest.approx((3 + 12) / (6 + 12))
    assert k2["mean_accepted_length"] == pytest.approx((3 + 2 + 1 + 18) / 9)
    assert k2["greedy_identical"] == 0.5  # the rag answer differs from baseline's
    assert k2["by_category"]["chat"]["greedy_identical"] == 1.0
    assert k2["by_category"]["rag"]["greedy_identical"] == 0.0
    assert k2["k_distribution"] == {"2": 9}
    assert k2["ttft_s"] == pytest.approx(0.4)
    assert methods["tandem[k=adaptive]"]["greedy_identical"] == 1.0
    assert methods["baseline"]["acceptance_rate"] is None
    assert methods["baseline"]["mean_accepted_length"] is None
    assert methods["hf-plain"]["greedy_identical"] == 1.0


def test_no_identity_when_sampling():
    methods = bench_methods.expand_methods(["baseline", "tandem"], [None])
    records = [make_record(1, "chat", "baseline", 5, 1.0, 0.1), make_record(1, "chat", "tandem", 5, 1.0, 0.1)]
    report = bench_report.build_report({}, records, methods, greedy=False)
    assert report["methods"]["tandem"]["greedy_identical"] is None


def test_alpha_counts_positions_reached():
    tally = bench_records.Tally()
    tally.record_round(4, 2)  # positions 0,1 accepted, 2 rejected, 3 never decided
    tally.record_round(4, 4)
    tally.record_round(0, 0)  # a plain step
    assert tally.position_reached == [2, 2, 2, 1]
    assert tally.position_accepted == [2, 2, 1, 1]
    assert tally.alpha == pytest.approx(6 / 7)
    assert tally.acceptance_rate == pytest.approx(6 / 8)
    assert tally.mean_accepted_length == pytest.approx((3 + 5 + 1) / 3)


def test_tally_from_engine_stats():
    from engine.stats import GenerationStats

    stats = GenerationStats(
        rounds=3,
        drafted=8,
        accepted=6,
        per_position_drafted=[2, 2, 2, 2],
        per_position_accepted=[2, 2, 1, 1],
        accepted_lengths=[3, 5, 1],
        k_history=[4, 4, 0],
        draft_time_s=0.8,
    )
    tally = bench_records.tally_from_stats(stats)
    assert tally.position_reached == [2, 2, 2, 1]
    assert tally.alpha == pytest.approx(6 / 7)
    assert tally.k_counts == Counter({4: 2, 0: 1})
    assert tally.draft_step_s == pytest.approx(0.1)


def test_table_prints_each_method_and_its_numbers():
    report = synthetic_report()
    table = bench_report.format_table(report)
    for name, method in report["methods"].items():
        line = next(line for line in table.splitlines() if line.startswith(name + " "))
        assert f"{method['tokens_per_s']:.2f}" in line
        assert f"{method['speedup_vs_baseline']:.2f}x" in line
    assert "speed-up vs baseline" in table and "rag" in table


def test_plots_are_written(tmp_path):
    report = synthetic_report()
    for name in ("tandem[k=2]", "tandem[k=adaptive]"):
        report["methods"][name].update(target_step_s=0.1, verify_forward_s={"1": 0.1, "3": 0.16, "5": 0.24})
    from engine.bench.plots import write_plots

    paths = write_plots(report, tmp_path / "plots")
    assert {p.name for p in paths} == {"speedup_vs_k.png", "acceptance_by_category.png", "speedup_theory.png"}
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5000


def test_theory_curve():
    from engine.bench.plots import interpolate, theoretical_speedup

    assert theoretical_speedup(0.0, 0.0, 3) == pytest.approx(1.0)
    assert theoretical_speedup(1.0, 0.0, 3) == pytest.approx(4.0)
    assert theoretical_speedup(0.5, 0.1, 2) == pytest.approx(1.75 / 1.2)
    assert interpolate({1: 1.0, 3: 2.0}, 2) == pytest.approx(1.5)
    assert interpolate({1: 1.0, 3: 2.0}, 4) is None


# ---- runners on tiny random models -------------------------------------------------------------


def test_hf_methods_match_tandem_baseline_on_a_tiny_model(make_tiny):
    from engine.settings import SamplingSettings

    target, draft = make_tiny(seed=0), make_tiny(seed=0)  # the draft is an exact copy: all drafts accepted
    sampling = SamplingSettings(max_new_tokens=12)
    methods = bench_methods.expand_methods(
        ["baseline", "baseline-eager", "tandem", "hf-assisted", "hf-lookup", "hf-plain"], [3]
    )
    runners = bench_methods.build_runners(
        methods, target, draft, "model", sampling, bench_methods.HFSettings()
    )
    prompts = [
        bench_prompts.BenchPrompt(1, "chat", ("Hello there", "And again")),
        bench_prompts.BenchPrompt(2, "qa", ("Why?",)),
    ]
    records = bench_suite.run_benchmark(runners, prompts, target.tokenizer)
    report = bench_report.build_report({}, records, methods, greedy=True)
    methods_section = report["methods"]
    for name in ("baseline-eager", "tandem", "hf-assisted", "hf-lookup", "hf-plain"):
        assert methods_section[name]["greedy_identical"] == 1.0, name
        assert methods_section[name]["generated_tokens"] == 3 * 12
    assert methods_section["tandem"]["acceptance_rate"] == 1.0
    assert methods_section["hf-assisted"]["acceptance_rate"] == 1.0
    assert methods_section["hf-assisted"]["mean_accepted_length"] > 1.5
    assert methods_section["hf-plain"]["acceptance_rate"] is None
    for name in methods_section:
        assert methods_section[name]["ttft_s"] > 0
    assert report["prompts"][0]["turns"] == 2


def test_repeats_keep_each_methods_fastest_pass_of_each_prompt(make_tiny, monkeypatch):
    from engine.settings import SamplingSettings

    target = make_tiny(seed=0)
    methods = bench_methods.expand_methods(["baseline", "tandem-ngram"], [None])
    runners = bench_methods.build_runners(
        methods, target, None, "model", SamplingSettings(max_new_tokens=6), bench_methods.HFSettings()
    )
    prompts = [
        bench_prompts.BenchPrompt(1, "chat", ("Hello there",)),
        bench_prompts.BenchPrompt(2, "qa", ("Why?",)),
    ]
    every_pass, play = [], bench_suite.run_conversation

    def recorded(*args, **kwargs):
        every_pass.append(play(*args, **kwargs))
        return every_pass[-1]

    monkeypatch.setattr(bench_suite, "run_conversation", recorded)
    records = bench_suite.run_benchmark(runners, prompts, target.tokenizer, repeats=3)
    assert len(every_pass) == 3 * 2 * 2 and len(records) == 2 * 2
    for record in records:
        passes = [r for r in every_pass if (r.question_id, r.method) == (record.question_id, record.method)]
        assert len(passes) == 3
        assert record.tally.time_s == min(r.tally.time_s for r in passes)


def test_hf_assisted_without_a_draft_model_is_refused(make_tiny):
    from engine.settings import SamplingSettings

    (method,) = bench_methods.expand_methods(["hf-assisted"], [None])
    with pytest.raises(SettingsError, match="hf-assisted needs a draft model"):
        bench_methods.HFRunner(method, make_tiny(), None, SamplingSettings(), bench_methods.HFSettings())


def test_round_recorder_restores_the_model(make_tiny):
    model = make_tiny().model
    with bench_methods.RoundRecorder(model):
        assert "_get_candidate_generator" in vars(model)
    assert "_get_candidate_generator" not in vars(model)


# ---- the command on the built-in pair ----------------------------------------------------------


def test_token_tree_rounds_are_counted_from_the_engines_stats():
    from engine.stats import GenerationStats

    stats = GenerationStats(rounds=4, drafted=4, accepted=2)
    stats.tree_rounds, stats.tree_nodes, stats.off_chain_rounds = 3, 5, 1
    one = bench_records.tally_from_stats(stats)
    total = bench_records.Tally().add(one).add(bench_records.tally_from_stats(stats))
    summary = bench_report.summarize(total, {}, None)
    assert (summary["tree_rounds"], summary["tree_nodes"], summary["off_chain_rounds"]) == (6, 10, 2)


@pytest.mark.slow
def test_bench_command_on_builtin_pair(tmp_path, capsys):
    from engine.cli.main import main

    out = tmp_path / "report.json"
    plots = tmp_path / "plots"
    code = main(
        [
            "bench",
            "--draft",
            "ngram",
            "--methods",
            "baseline,tandem,tandem-head",
            "--limit",
            "2",
            "--max-new-tokens",
            "16",
            "--warmup",
            "0",
            "--json",
            str(out),
            "--plots",
            str(plots),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["config"]["prompt_count"] == 2
    assert len(report["config"]["categories"]) == 2
    tandem, baseline = report["methods"]["tandem"], report["methods"]["baseline"]
    for key in REQUIRED_FIELDS:
        assert key in tandem
    assert tandem["greedy_identical"] == 1.0
    assert tandem["speedup_vs_baseline"] == pytest.approx(tandem["tokens_per_s"] / baseline["tokens_per_s"])
    assert tandem["generated_tokens"] > 0 and tandem["k_distribution"]
    assert len(report["prompts"]) == 2
    head = report["methods"]["tandem-head"]  # the shipped draft head, whatever --draft names
    assert head["greedy_identical"] == 1.0 and head["k_distribution"], head
    table = capsys.readouterr().out
    assert "tandem" in table and f"{tandem['tokens_per_s']:.2f}" in table
    assert sorted(p.name for p in plots.iterdir()) == [
        "acceptance_by_category.png",
        "speedup_theory.png",
        "speedup_vs_k.png",
    ]


def test_the_cli_chat_drafts_as_the_app_does_and_the_bench_tandem_method_keeps_the_copy():
    from app.config import DEFAULT_DRAFTER
    from engine.cli.bench import draft_kind
    from engine.cli.chat import draft_spec_for, speculation_from_args
    from engine.cli.main import build_parser

    parser = build_parser()
    for command in (["chat"], ["serve"]):
        args = parser.parse_args(command)
        speculation = speculation_from_args(args)
        assert speculation.drafter == DEFAULT_DRAFTER == "auto"
        assert draft_spec_for(args, speculation) is None  # auto drafts with the quantized copy too
    assert speculation_from_args(parser.parse_args(["chat", "--draft", "none"])).drafter == "none"
    bench = parser.parse_args(["bench"])
    assert bench.draft is None and draft_kind(bench.draft) == "model"


def test_decode_speed_counts_the_tokens_after_the_first_over_the_time_after_it():
    from engine.bench.records import Tally

    tally = Tally(calls=1, generated_tokens=10, time_s=1.0)
    tally.time_first_token(0.2)
    assert tally.ttft_s == 0.2 and tally.decode_tokens == 9
    assert abs(tally.decode_tokens_per_s - 9 / 0.8) < 1e-9
    one = Tally(calls=1, generated_tokens=1, time_s=0.3)
    one.time_first_token(0.3)  # a one-token reply decodes nothing after its first token
    assert one.decode_tokens_per_s is None
    assert tally.add(one).decode_tokens_per_s == tally.decode_tokens_per_s
