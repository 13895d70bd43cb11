"""`tandem-cli bench`: measures Tandem's speculative decoding against the target alone and transformers."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

from engine.bench.methods import METHOD_KINDS, HFSettings, Method
from engine.errors import SettingsError

DEFAULT_METHODS = "baseline,tandem,tandem-ngram,tandem-head,tandem-auto,hf-assisted,hf-lookup,hf-plain"


def add_bench_parser(subparsers) -> None:
    from engine.cli.chat import add_model_options

    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the target alone and transformers",
        description="Runs a prompt file (MT-Bench / Spec-Bench format) through each method, interleaved per "
        "prompt, and reports tokens/s (generated tokens over call time, prefill included), speed-ups, "
        "acceptance, TTFT and greedy identity with the baseline.",
    )
    parser.add_argument("--prompts", default=None, help="JSONL prompt file (default: Tandem's built-in set)")
    # `tandem` (and hf-assisted) draft with a quantized copy unless --draft says otherwise; `tandem-auto`
    # is the chat's default
    add_model_options(parser, default_draft=None)
    parser.add_argument(
        "--k",
        action="append",
        default=None,
        help="'adaptive' or a draft length 1-16; repeat for a sweep (--k 2 --k 4 --k adaptive)",
    )
    parser.add_argument("--max-k", type=int, default=8, help="largest K adaptive mode may choose")
    parser.add_argument(
        "--head-vocab",
        type=int,
        help="the draft head's vocabulary N: a prefix of its own (most frequent first), or widened with "
        "the target's rows up to N (default: the head's own)",
    )
    parser.add_argument(
        "--trees", choices=["on", "off"], default="on", help="token trees for the Tandem methods (default on)"
    )
    parser.add_argument(
        "--methods",
        default=None,
        help=f"comma list from {', '.join(METHOD_KINDS)} (default: {DEFAULT_METHODS})",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--limit", type=int, default=None, help="at most N prompts, taken from each category in turn"
    )
    parser.add_argument("--categories", default=None, help="comma list of categories to keep")
    parser.add_argument(
        "--min-turns",
        type=int,
        default=1,
        help="only questions of at least N user turns (2: multi-turn chats)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes of the first prompt per method")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed passes of every prompt per method; each keeps its fastest (steadier per-prompt figures)",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="write the full report to this file")
    parser.add_argument("--plots", default=None, help="write PNG plots to this folder")
    hf = HFSettings()
    parser.add_argument(
        "--hf-assistant-tokens",
        type=int,
        default=hf.assistant_tokens,
        help="hf-assisted: draft tokens in the first round (num_assistant_tokens)",
    )
    parser.add_argument(
        "--hf-schedule",
        default=hf.assistant_schedule,
        help="hf-assisted: num_assistant_tokens_schedule (heuristic, heuristic_transient or constant)",
    )
    parser.add_argument(
        "--hf-lookup-tokens", type=int, default=hf.lookup_tokens, help="hf-lookup: prompt_lookup_num_tokens"
    )
    parser.add_argument(
        "--synthetic",
        metavar="TARGET:DRAFT",
        default=None,
        help="instead of the prompt set: what decoding costs on this device, on random-weight models built "
        "from published configs (qwen2.5-7b:qwen2.5-0.5b on a GPU; tiny:tiny-draft anywhere); --json, "
        "--limit (prompts) and --max-new-tokens apply",
    )
    parser.set_defaults(handler=run_bench)


def run_synthetic(args) -> int:
    """`bench --synthetic`: engine.bench.synthetic's report, printed part by part."""
    import torch

    from engine.bench import synthetic
    from engine.models.loaded import resolve_device

    names = args.synthetic.split(":")
    if len(names) != 2 or not all(name in synthetic.CONFIGS for name in names):
        raise SettingsError(
            f"--synthetic takes TARGET:DRAFT from {', '.join(synthetic.CONFIGS)}, not {args.synthetic!r}"
        )
    device = resolve_device(args.device)
    if args.json_path:
        check_writable(args.json_path)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    json_path = Path(args.json_path) if args.json_path else None
    synthetic.run(args.synthetic, device, dtype, args.limit or 4, 128, args.max_new_tokens, json_path)
    return 0


def draft_kind(draft_arg: str | None) -> str:
    value = (draft_arg or "").lower()
    if value == "head" or value.startswith("head:"):
        return "head"
    return value if value in ("ngram", "none") else "model"


def head_source(draft_arg: str | None) -> str | None:
    """The folder of `--draft head:DIR`; None for the shipped head (or no head)."""
    if draft_kind(draft_arg) == "head" and ":" in draft_arg:
        return draft_arg.split(":", 1)[1]
    return None


def chosen_method_kinds(args) -> list[str]:
    if args.methods:
        return [name.strip() for name in args.methods.split(",") if name.strip()]
    kinds = DEFAULT_METHODS.split(",")
    if draft_kind(args.draft) != "model":
        kinds.remove("hf-assisted")  # it needs a draft model
    if draft_kind(args.draft) == "head":
        kinds.remove("tandem-head")  # `tandem` drafts with it already
    return kinds


def without_missing_head(args, methods: list[Method], target) -> list[Method]:
    """The default methods without `tandem-head` where no draft head ships for the target."""
    from engine.heads.head import shipped_head_folder

    if args.methods or shipped_head_folder(target.name) is not None:
        return methods
    return [method for method in methods if method.kind != "tandem-head"]


def needs_draft_model(methods: list[Method], kind: str) -> bool:
    return any(
        m.kind == "hf-assisted" or (m.kind in ("tandem", "tandem-auto") and kind == "model") for m in methods
    )


def load_models(args, methods: list[Method]):
    from engine.cli.chat import ProgressBar
    from engine.models.pair import load_pair

    kind = draft_kind(args.draft)
    draft_spec = args.draft if kind == "model" else "none"
    if kind != "model" and any(m.kind == "hf-assisted" for m in methods):
        raise SettingsError(f"hf-assisted needs a draft model, but --draft is '{args.draft}'.")
    if not needs_draft_model(methods, kind):
        draft_spec = "none"
    progress = ProgressBar()
    import torch

    # methods run back to back, llama.cpp's among them: the engine would read those runs as other
    # programs' load (engine.runtime.threads), so every method runs on torch's thread count
    os.environ.setdefault("TANDEM_THREADS", str(torch.get_num_threads()))
    try:
        return load_pair(
            args.target,
            draft_spec,
            quantization=args.quant,
            device=args.device,
            progress=progress,
            target_precision=args.precision,
        )
    finally:
        progress.close()


def bench_config(args, prompts_path, prompts, methods, k_values, hf: HFSettings) -> dict:
    import torch
    import transformers

    from engine.bench.suite import __doc__ as definitions

    return {
        "prompts_file": str(prompts_path),
        "prompt_count": len(prompts),
        "turn_count": sum(len(p.turns) for p in prompts),
        "categories": sorted({p.category for p in prompts}),
        "limit": args.limit,
        "min_turns": args.min_turns,
        "target": args.target,
        "draft": args.draft if args.draft else "quantized copy of the target",
        "quant": args.quant,
        "precision": args.precision or "default",
        "compiled": args.compiled,
        "device": args.device,
        "k": ["adaptive" if k is None else k for k in k_values],
        "max_k": args.max_k,
        "trees": args.trees,
        "head_vocab": args.head_vocab,
        "methods": [m.name for m in methods],
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "hf": {
            "num_assistant_tokens": hf.assistant_tokens,
            "num_assistant_tokens_schedule": hf.assistant_schedule,
            "assistant_confidence_threshold": hf.assistant_confidence_threshold,
            "prompt_lookup_num_tokens": hf.lookup_tokens,
            "max_matching_ngram_size": hf.lookup_ngram,
        },
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "definitions": " ".join((definitions or "").split()),
    }


def runner_extras(runners) -> dict[str, dict]:
    """Per method: the target's measured step time and verify cost curve (Tandem methods only)."""
    target_step = next((r.target_step_s for r in runners if hasattr(r, "target_step_s")), None)
    extras = {}
    for runner in runners:
        extras[runner.method.name] = {
            "target_step_s": getattr(runner, "target_step_s", target_step),
            "verify_forward_s": {str(n): s for n, s in getattr(runner, "verify_forward_s", {}).items()},
        }
    return extras


def check_writable(path: str) -> None:
    """Refuse a --json file that cannot be written, before an hour of benchmark."""
    import tempfile
    from pathlib import Path

    target = Path(path)
    try:
        if target.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as exc:
        raise SettingsError(
            f"--json {path} cannot be written ({exc.strerror}): choose another file."
        ) from None


def save_report(report: dict, path: str, write_report) -> str:
    """Write the report; if that fails now (disk full, folder gone), into the temporary folder instead."""
    import tempfile
    from pathlib import Path

    try:
        return f"report: {write_report(report, path)}"
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"tandem-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
        write_report(report, fallback)
        return f"report: {path} could not be written ({exc.strerror}); saved to {fallback} instead"


def run_bench(args) -> int:
    if args.synthetic:
        return run_synthetic(args)
    from tqdm import tqdm

    from engine.bench import methods as bench_methods
    from engine.bench import prompts as bench_prompts
    from engine.bench import report as bench_report
    from engine.bench import suite as bench_suite
    from engine.cli.chat import ProgressBar, sampling_from_args

    if args.plots and importlib.util.find_spec("matplotlib") is None:  # say so before an hour of benchmark
        raise SettingsError("--plots needs matplotlib, which this installation lacks: pip install matplotlib")
    if args.json_path:
        check_writable(args.json_path)  # before the benchmark, not after it
    prompts_path = args.prompts or bench_prompts.default_prompts_path()
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    prompts = bench_prompts.select_prompts(
        bench_prompts.load_prompts(prompts_path), categories, args.limit, args.min_turns
    )
    k_values = bench_methods.parse_k_values(args.k)
    methods = bench_methods.expand_methods(chosen_method_kinds(args), k_values)
    args.top_k, args.top_p = 0, 1.0
    sampling = sampling_from_args(args)
    hf = HFSettings(
        assistant_tokens=args.hf_assistant_tokens,
        assistant_schedule=args.hf_schedule,
        lookup_tokens=args.hf_lookup_tokens,
    )
    hf.validate()
    if args.head_vocab is not None and args.head_vocab < 1:
        raise SettingsError(f"--head-vocab must be 1 or more, not {args.head_vocab}.")
    if args.warmup < 0:
        raise SettingsError(f"--warmup must be 0 or more, not {args.warmup}.")
    if args.repeat < 1:
        raise SettingsError(f"--repeat must be 1 or more, not {args.repeat}.")

    target, draft = load_models(args, methods)
    methods = without_missing_head(args, methods, target)
    progress = ProgressBar()  # a first compiled build, the verify cost, the draft head
    runners = bench_methods.build_runners(
        methods,
        target,
        draft,
        draft_kind(args.draft),
        sampling,
        hf,
        args.max_k,
        trees=args.trees == "on",
        compiled=args.compiled,
        head_source=head_source(args.draft),
        head_vocab=args.head_vocab,
        progress=progress,
    )
    progress.close()
    engines = {id(r.engine): r.engine for r in runners if hasattr(r, "engine")}
    notices = list(dict.fromkeys(notice for engine in engines.values() for notice in engine.notices))
    for notice in notices:  # before the run: an eager target (a failed build) is worth knowing now
        print(f"note: {notice}", file=sys.stderr)
    total = len(runners) * (args.warmup + args.repeat * len(prompts))
    with tqdm(total=total, file=sys.stderr, unit="run", leave=False) as bar:

        def step(name: str) -> None:
            bar.set_postfix_str(name)
            bar.update(1)

        bar.set_description("warm-up")
        bench_suite.warm_up(runners, prompts[0], target.tokenizer, args.warmup, step)
        bar.set_description("bench")
        records = bench_suite.run_benchmark(runners, prompts, target.tokenizer, step, args.repeat)

    config = bench_config(args, prompts_path, prompts, methods, k_values, hf)
    # what "compiled" became on this machine: the Tandem methods' target compiled or eager
    config["target_runs"] = sorted(
        {"compiled" if getattr(e, "runs_compiled", False) else "eager" for e in engines.values()}
    )
    config["notices"] = notices
    if draft is not None:  # what --quant auto chose for the quantized copy
        config["draft_quantization"] = draft.quantization
    report = bench_report.build_report(config, records, methods, sampling.greedy, runner_extras(runners))
    print(bench_report.format_table(report))
    if args.json_path:
        print(save_report(report, args.json_path, bench_report.write_report), file=sys.stderr)
    if args.plots:
        from engine.bench.plots import write_plots

        for path in write_plots(report, args.plots):
            print(f"plot: {path}", file=sys.stderr)
    return 0
