"""`tandem-cli quant-report`: every quantized kernel that runs here, measured against fp32 in one run.

Per kernel: ms per token at a 200-token context (one-token forwards on the draft's eager runner,
kernels taking turns so load from other processes hits them alike, median), c = that time over the
fp32 model's in the same run, weight memory, the check's result on the probe text, and top-1
agreement with fp32 on the built-in prompts (fp32 greedy continuations, teacher-forced: the share
of continuation tokens where the kernel's top-1 is fp32's, which is the per-token acceptance rate
of a greedy draft). Acceptance in the full speculative loop is `tandem-cli bench`'s job.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

DEFAULT_PROMPTS = 4
DEFAULT_CONTINUATION = 48


def add_quant_report_parser(subparsers) -> None:
    from engine.models.builtin import DEFAULT_TARGET

    parser = subparsers.add_parser(
        "quant-report",
        help="measure every quantized kernel against fp32 on this machine",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="built-in name, model folder, .gguf or hub id"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--kernels", default=None, help="comma list of kernel names (default: all that run here)"
    )
    parser.add_argument("--context", type=int, default=200, help="tokens in the cache when timing")
    parser.add_argument("--steps", type=int, default=12, help="timed one-token forwards per kernel per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timing, kernels taking turns")
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help="built-in prompts for agreement")
    parser.add_argument("--tokens", type=int, default=DEFAULT_CONTINUATION, help="fp32 tokens per prompt")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the rows to this file")
    parser.set_defaults(handler=run_quant_report)


def run_quant_report(args) -> int:
    import torch

    from engine.errors import SettingsError
    from engine.models.loaded import resolve_device
    from engine.models.loading import load_model

    if args.context < 1 or args.steps < 1 or args.rounds < 1 or args.prompts < 1 or args.tokens < 1:
        raise SettingsError("--context, --steps, --rounds, --prompts and --tokens must be at least 1.")
    kernels = chosen_kernels(args.kernels, resolve_device(args.device).type)
    print(f"Loading {args.target}...", file=sys.stderr)
    loaded = load_model(args.target, device=args.device, precision="fp32")
    report = measure(loaded, kernels, args)
    report["machine"] = machine_summary(torch)
    print(format_table(report))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    return 0


def chosen_kernels(names: str | None, device_type: str):
    from engine.errors import SettingsError
    from engine.kernels.quant_kernels import KERNELS

    if names is None:
        return [k for k in KERNELS.values() if k.device_type == device_type and not k.load_time]
    unknown = [n for n in names.split(",") if n not in KERNELS]
    if unknown:
        raise SettingsError(f"Unknown kernel {', '.join(unknown)}; known: {', '.join(KERNELS)}.")
    return [KERNELS[n] for n in names.split(",")]


def measure(loaded, kernels, args) -> dict:
    import copy

    from engine.kernels import quant_check as qc
    from engine.models.memory import model_memory_bytes

    probes = qc.probe_inputs(loaded.tokenizer, loaded.device)
    maxima, reference = qc.reference_run(loaded.model, probes)
    sequences = fp32_continuations(loaded, args.prompts, args.tokens)
    fp32_rows = next_token_choices(loaded.model, sequences)
    models = {"fp32": loaded.model}
    rows = {
        "fp32": {
            "kernel": "fp32",
            "summary": "the float model",
            "memory_bytes": model_memory_bytes(loaded.model),
        }
    }
    for kernel in kernels:
        reason = kernel.unavailable_reason()
        if reason is not None:
            rows[kernel.name] = {"kernel": kernel.name, "summary": kernel.summary, "unavailable": reason}
            continue
        print(f"Building {kernel.name}...", file=sys.stderr)
        started = time.perf_counter()
        model = kernel.build(copy.deepcopy(loaded.model), maxima).eval()
        build_s = time.perf_counter() - started
        check = qc.check_against(reference, model, probes, kernel.mode)
        choices = next_token_choices(model, sequences)
        agree = sum(int((a == b).sum()) for a, b in zip(choices, fp32_rows, strict=True))
        total = sum(a.numel() for a in fp32_rows)
        rows[kernel.name] = {
            "kernel": kernel.name,
            "summary": kernel.summary,
            "memory_bytes": model_memory_bytes(model),
            "build_s": round(build_s, 2),
            "check": check.to_dict(),
            "prompt_agreement": round(agree / total, 4),
        }
        models[kernel.name] = model
    print("Timing...", file=sys.stderr)
    for name, ms in decode_ms(models, args.context, args.steps, args.rounds).items():
        rows[name]["ms_per_token"] = round(ms, 2)
    base = rows["fp32"]["ms_per_token"]
    for row in rows.values():
        if "ms_per_token" in row:
            row["c"] = round(row["ms_per_token"] / base, 3)
    return {
        "target": loaded.spec,
        "context": args.context,
        "prompts": args.prompts,
        "tokens_per_prompt": args.tokens,
        "rows": list(rows.values()),
    }


def fp32_continuations(loaded, prompts: int, tokens: int):
    """Built-in prompts, chat-formatted, each followed by the fp32 model's greedy continuation: [n] ids."""
    import torch

    from engine.bench.prompts import default_prompts_path, load_prompts, select_prompts
    from engine.models.chat_template import chat_prompt_ids

    chosen = select_prompts(load_prompts(default_prompts_path()), limit=prompts)
    sequences = []
    for prompt in chosen:
        ids = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        inputs = torch.tensor([ids], device=loaded.device)
        with torch.inference_mode():
            out = loaded.model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=tokens,
                do_sample=False,
                pad_token_id=loaded.tokenizer.eos_token_id,
            )
        sequences.append((out[0], len(ids)))
    return sequences


def next_token_choices(model, sequences):
    """The model's top-1 next token at each continuation position (teacher-forced): [m] per sequence."""
    import torch

    choices = []
    with torch.inference_mode():
        for ids, prompt_length in sequences:
            logits = model(input_ids=ids.view(1, -1), use_cache=False).logits[0]  # [n, V]
            choices.append(logits[prompt_length - 1 : -1].argmax(-1))
    return choices


def decode_ms(models: dict, context: int, steps: int, rounds: int) -> dict[str, float]:
    """Median ms of a one-token forward after `context` tokens, on each model's draft runner."""
    import torch

    from engine.runtime.fastest_runner import make_runner

    runners = {name: make_runner(model, compiled="off") for name, model in models.items()}
    prompt = torch.randint(0, 1000, (context,))
    for runner in runners.values():
        runner.reset()
        runner.prefill(prompt)
    times: dict[str, list[float]] = {name: [] for name in runners}
    token = torch.tensor([42])
    for _ in range(rounds):
        for name, runner in runners.items():
            runner.forward(token)  # untimed: warms this runner's caches after the others ran
            runner.rollback(context)
            for _ in range(steps):
                started = time.perf_counter()
                runner.forward(token)
                runner.synchronize()
                times[name].append(time.perf_counter() - started)
                runner.rollback(context)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def machine_summary(torch) -> dict:
    from engine.kernels.cpu_features import cpu_signature, has_vnni

    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_signature(),
        "vnni": has_vnni(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def format_table(report: dict) -> str:
    header = f"{'kernel':<22} {'ms/tok':>7} {'c':>6} {'MiB':>6} {'probe agr':>9} {'max err':>8} {'prompt agr':>10}  check"
    lines = [f"Kernels on {report['target']}, {report['context']}-token context", header, "-" * len(header)]
    for row in report["rows"]:
        if "unavailable" in row:
            lines.append(f"{row['kernel']:<22} unavailable: {row['unavailable']}")
            continue
        check = row.get("check")
        lines.append(
            f"{row['kernel']:<22} {row['ms_per_token']:>7.2f} {row['c']:>6.2f} "
            f"{row['memory_bytes'] / 2**20:>6.0f} "
            + (
                f"{check['agreement']:>9.3f} {check['max_logit_error']:>8.2f} {row['prompt_agreement']:>10.3f}  "
                + ("pass" if check["passed"] else "FAIL")
                if check
                else f"{'':>9} {'':>8} {'':>10}  reference"
            )
        )
    return "\n".join(lines)
