"""The device-cost report (engine.bench.synthetic) on a tiny random pair: every part measured, the
loop's tokens equal to transformers' greedy ones, and the bound as its formula gives it."""

from __future__ import annotations

import json

import pytest
import torch

from engine.bench import synthetic
from engine.bench.forward_timing import bound, expected_tokens


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic") / "report.json"
    data = synthetic.run("tiny:tiny-draft", torch.device("cpu"), torch.float32, 2, 40, 24, out)
    assert json.loads(out.read_text()).keys() == data.keys()  # written as it goes
    return data


def test_every_part_is_measured_and_only_the_gpu_kernels_are_missing(report):
    failed = {
        name: part["error"] for name, part in report.items() if isinstance(part, dict) and "error" in part
    }
    assert set(failed) == {"step_draft-int4", "step_target-int4"}, failed
    assert all("needs an NVIDIA GPU" in error for error in failed.values())
    assert set(report["verify_ms"]) == set(range(1, synthetic.MAX_VERIFY + 1))
    assert report["summary"]["tandem_graphed_over_hf_plain"] > 0


def test_the_loops_tokens_are_transformers_greedy_tokens(report):
    for name in ("tandem_eager", "tandem_graphed"):
        assert report["greedy_vs_hf_plain"][name]["identical"] == 2
    for name, run in report["exactness_fp32_vs_hf"].items():
        assert run["identical"] == run["of"] == 2, name
    drafting_for_itself = report["loop_self_draft"]
    assert all(
        run["acceptance"] == 1.0 for run in drafting_for_itself.values() if run["acceptance"] is not None
    )


def test_the_bound_is_the_best_k_of_its_formula():
    t_verify = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}
    speed, k = bound(0.7, 1.0, 0.1, t_verify)
    by_k = {k: expected_tokens(0.7, k) / (k * 0.1 + t_verify[k + 1]) for k in range(1, 5)}
    assert k == max(by_k, key=by_k.get) and speed == round(by_k[k], 3)
    assert expected_tokens(0.0, 4) == 1.0


def test_tandem_cli_bench_runs_the_report_with_its_own_options(tmp_path):
    from engine.cli.main import main

    out = tmp_path / "report.json"
    argv = [
        "bench",
        "--synthetic",
        "tiny:tiny-draft",
        "--device",
        "cpu",
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
    ]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["environment"]["prompts"] == 1 and report["environment"]["new_tokens"] == 8
    assert "summary" in report
