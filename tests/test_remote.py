"""The remote backend's pure parts: vLLM's /metrics text format, stats from metric deltas, addresses
and API-key storage. The parts that talk HTTP are tested against real servers in test_server.py and
test_llama_server.py."""

from __future__ import annotations

import os
import stat

import pytest

from engine.remote.metrics_page import SpecCounters, parse_prometheus, spec_counters
from engine.server.metrics import ServerMetrics, quantile
from engine.stats import GenerationStats

# The text format vLLM's OpenAI server exposes on /metrics (prometheus_client: counters get a _total
# sample and a _created sample; one series per engine under data parallelism), from a speculative pair
# served with `--speculative-config '{"method": "eagle3", "num_speculative_tokens": 3, ...}'`.
VLLM_SAMPLE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 1.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct"} 20.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 1.7644e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct"} 60.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 210.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct"} 40.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct",position="1"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct",position="2"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct",position="0"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct",position="1"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="meta-llama/Llama-3.1-70B-Instruct",position="2"} 8.0
"""


def test_vllm_metrics_page_is_parsed_and_summed_over_engines():
    counters = spec_counters(VLLM_SAMPLE)
    assert counters == SpecCounters(120.0, 360.0, 250.0, (108.0, 84.0, 58.0))
    # vLLM's own derived figures follow from them
    assert counters.num_accepted_tokens / counters.num_draft_tokens == pytest.approx(250 / 360)
    assert 1 + counters.num_accepted_tokens / counters.num_drafts == pytest.approx(1 + 250 / 120)
    assert sum(counters.accepted_per_pos) == counters.num_accepted_tokens


def test_prometheus_samples_keep_labels_and_skip_comments():
    samples = parse_prometheus(VLLM_SAMPLE + 'odd{a="x \\"quoted\\"",b="2"} 3.5 1700000000\n')
    assert (
        "vllm:num_requests_running",
        {"engine": "0", "model_name": "meta-llama/Llama-3.1-70B-Instruct"},
        1.0,
    ) in samples
    assert samples[-1] == ("odd", {"a": 'x "quoted"', "b": "2"}, 3.5)
    assert all(not name.startswith("#") for name, _, _ in samples)


def test_a_page_without_speculative_counters_reports_none():
    assert spec_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n") is None
    assert spec_counters("<html>not a metrics page</html>\n") is None


def test_tandems_own_page_reads_back_with_the_same_parser():
    served = ServerMetrics()
    stats = GenerationStats(
        drafter="ngram",
        drafted=7,
        accepted=4,
        generated_tokens=12,
        prompt_tokens=30,
        per_position_drafted=[3, 2, 2],
        per_position_accepted=[2, 1, 1],
    )
    served.add_generation(stats)
    served.add_generation(stats)
    served.count_request("completed")
    served.add_cancel_latency(0.1)
    page = served.render('model "quoted"')
    assert spec_counters(page) == SpecCounters(6.0, 14.0, 8.0, (4.0, 2.0, 2.0))
    by_name = {(name, labels.get("outcome")): value for name, labels, value in parse_prometheus(page)}
    assert by_name[("tandem:request_total", "completed")] == 1
    assert by_name[("tandem:generation_tokens_total", None)] == 24
    assert {labels["model_name"] for _, labels, _ in parse_prometheus(page)} == {'model "quoted"'}


def test_counter_deltas_pad_new_positions():
    before = SpecCounters(10, 30, 20, (9, 7))
    after = SpecCounters(14, 42, 26, (12, 9, 1))
    assert after.minus(before) == SpecCounters(4, 12, 6, (3, 2, 1))


def test_stats_from_vllm_metric_deltas_say_what_was_not_reported():
    from engine.remote.client import RemoteEngine, _Reply

    remote = RemoteEngine("http://127.0.0.1:9")
    reply = _Reply(start=0.0)
    reply.usage = {"prompt_tokens": 40, "completion_tokens": 50}
    stats = remote._stats(reply, SpecCounters(10, 30, 20, (9, 7, 4)), SpecCounters(30, 90, 60, (27, 21, 12)))
    assert stats.source == "vllm-metrics"
    assert (stats.rounds, stats.drafted, stats.accepted) == (20, 60, 40)
    assert stats.per_position_accepted == [18, 14, 8] and stats.per_position_drafted == [20, 20, 20]
    assert stats.acceptance_rate == pytest.approx(40 / 60)
    assert (stats.prompt_tokens, stats.generated_tokens) == (40, 50)
    for name in (
        "speedup",
        "mean_accepted_length",
        "target_step_time_s",
        "prefill_time_s",
        "decode_tokens_per_s",
    ):
        assert name in stats.unreported
    for name in ("drafted", "accepted", "acceptance_rate", "per_position_acceptance", "generated_tokens"):
        assert name not in stats.unreported
    assert stats.speedup is None and stats.mean_accepted_length is None  # nothing invented
    remote.close()


def test_a_server_reporting_only_usage_reports_no_speculation():
    from engine.remote.client import RemoteEngine, _Reply

    remote = RemoteEngine("http://127.0.0.1:9")
    reply = _Reply(start=0.0)
    reply.usage = {"prompt_tokens": 5, "completion_tokens": 9}
    stats = remote._stats(reply, None, None)
    assert stats.source == "openai-compatible" and stats.drafter == "not reported"
    assert {"drafter", "drafted", "accepted", "acceptance_rate", "speedup"} <= set(stats.unreported)
    assert stats.generated_tokens == 9
    remote.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost:8000", "http://localhost:8000"),
        ("http://h:1/v1/", "http://h:1"),
        ("https://h.example", "https://h.example"),
    ],
)
def test_server_addresses_are_normalised(given, expected):
    from engine.remote.client import normalize_base_url

    assert normalize_base_url(given) == expected


def test_a_bad_server_address_is_a_message():
    from engine.remote.client import normalize_base_url
    from engine.remote.errors import RemoteRequestError

    with pytest.raises(RemoteRequestError, match="not a server address"):
        normalize_base_url("ftp://h")


def test_api_keys_go_to_a_private_file_without_a_keyring(tmp_path, monkeypatch):
    from engine.remote import credentials

    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("TANDEM_CREDENTIALS", "file")
    assert credentials.load_api_key("http://h:1") is None
    credentials.save_api_key("http://h:1/", "secret-1")
    credentials.save_api_key("http://other:2", "secret-2")
    path = credentials.credentials_path()
    assert path.parent == tmp_path and "readable by you only" in credentials.credential_store()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert credentials.load_api_key("http://h:1") == "secret-1"
    credentials.delete_api_key("http://h:1")
    assert (
        credentials.load_api_key("http://h:1") is None
        and credentials.load_api_key("http://other:2") == "secret-2"
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_unreadable_key_file_is_a_message(tmp_path, monkeypatch):
    from engine.errors import StorageError
    from engine.remote import credentials

    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("TANDEM_CREDENTIALS", "file")
    credentials.credentials_path().write_text("{broken")
    with pytest.raises(StorageError, match="Delete the file"):
        credentials.load_api_key("http://h:1")


def test_quantile_is_nearest_rank():
    assert quantile([], 0.95) is None
    assert quantile([0.1, 0.2, 0.3, 0.4], 0.5) == 0.2
    assert quantile([float(i) for i in range(1, 21)], 0.95) == 19.0
