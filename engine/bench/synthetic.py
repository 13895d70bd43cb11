"""What speculative decoding costs on this device, measured on a random-weight pair built from real configs.

Random weights cost what trained ones cost, but they accept nothing a trained draft would: so this
measures the costs (the target alone, t_verify(n), each draft's step, the loop's own overhead with
a draft that is the target itself and accepts nearly everything) and prices a real draft from them,
as the bound E(K) * t_target / (K * t_draft + t_verify(K + 1)) at acceptance 0.6-0.8. It needs only
torch, transformers and platformdirs, so it runs on a bare GPU machine:

    python -m engine.bench.synthetic --pair qwen2.5-7b:qwen2.5-0.5b --out report.json

Each part of the report is written as soon as it is measured; a part that fails records its error
and the rest still run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch

from engine.bench.forward_timing import agreement, bound, step_times, synchronize
from engine.bench.random_pair import CONFIGS, NumberedTokens, build_model, int4_copy, model_bytes

ALPHAS = (0.6, 0.7, 0.8)
MAX_VERIFY = 16


def runner_for(model, device, graphed: bool, max_seq_length: int):
    from engine.runtime.fastpath import FastRunner

    return FastRunner(model, device, max_seq_length, compiled="auto" if graphed else "off")


def drafting_for_itself(model, device, max_seq_length: int):
    """The model as its own draft, on a graphed runner (and KV cache) of its own."""
    from engine.decoding.drafters.model import ModelDrafter

    return ModelDrafter(runner_for(model, device, True, max_seq_length), model.config.vocab_size, "self")


def generate_with(
    target, drafter, prompt: list[int], new_tokens: int, k, temperature: float = 0.0, curve=None, planner=None
):
    """One reply; `planner` carries what adaptive K measured over from earlier replies, as the app's does."""
    from engine.decoding.planner import planner_for
    from engine.decoding.speculative import generate
    from engine.decoding.verify_cost import VerifyCostCurve
    from engine.settings import SamplingSettings, SpeculationSettings

    sampling = SamplingSettings(temperature=temperature, max_new_tokens=new_tokens, seed=1)
    speculation = SpeculationSettings(k=k, trees=False)
    drafters = [drafter] if drafter is not None else []  # none: plain decoding
    target.reset()
    for member in drafters:
        member.reset()
    if planner is None:
        planner = planner_for(drafters, speculation, curve if curve is not None else VerifyCostCurve())
    finished = generate(target, planner, prompt, sampling, speculation, set(), NumberedTokens())
    return list(finished.token_ids), finished.stats


def loop_run(target, drafter, prompts, new_tokens, k, device, curve=None, temperature=0.0) -> dict:
    """Tandem's loop over every prompt (one planner for them all, as over a conversation's turns):
    tokens/s, acceptance, and the round's parts."""
    from engine.decoding.planner import planner_for
    from engine.settings import SpeculationSettings

    outputs = []
    totals = dict(
        tokens=0, seconds=0.0, drafted=0, accepted=0, rounds=0, drafted_rounds=0, draft=0.0, verify=0.0
    )
    planner = None
    if drafter is not None and curve is not None:
        planner = planner_for([drafter], SpeculationSettings(k=k, trees=False), curve)
    # untimed, on a planner of its own: first captures and library set-up stay out of the figures
    generate_with(target, drafter, prompts[0], 8, k, temperature)
    for prompt in prompts:
        synchronize(device)
        begun = time.perf_counter()
        tokens, stats = generate_with(target, drafter, prompt, new_tokens, k, temperature, curve, planner)
        synchronize(device)
        totals["seconds"] += time.perf_counter() - begun
        totals["tokens"] += len(tokens)
        totals["drafted"] += stats.drafted
        totals["accepted"] += stats.accepted
        totals["rounds"] += stats.rounds
        totals["drafted_rounds"] += sum(1 for k in stats.k_history if k > 0)
        totals["draft"] += stats.draft_time_s
        totals["verify"] += stats.verify_time_s
        outputs.append(tokens)
    rounds = max(totals["rounds"], 1)
    return dict(
        tok_s=totals["tokens"] / totals["seconds"],
        acceptance=totals["accepted"] / totals["drafted"] if totals["drafted"] else None,
        tokens_per_round=totals["tokens"] / rounds,
        draft_ms_per_round=1000 * totals["draft"] / rounds,
        verify_ms_per_round=1000 * totals["verify"] / rounds,
        rounds=totals["rounds"],
        drafted_rounds=totals["drafted_rounds"],
        outputs=outputs,
    )


def hf_generate(model, prompts, new_tokens: int, device, assistant=None) -> dict:
    outputs, seconds, made = [], 0.0, 0
    for prompt in prompts:
        ids = torch.tensor([prompt], device=device)
        options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        if assistant is not None:
            options["assistant_model"] = assistant
        synchronize(device)
        begun = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
        synchronize(device)
        seconds += time.perf_counter() - begun
        new = out[0, ids.shape[1] :].tolist()
        made += len(new)
        outputs.append(new)
    return dict(tok_s=made / seconds, outputs=outputs)


class Report:
    def __init__(self, path: Path | None, only: set[str] | None = None):
        self.path, self.data, self.only = path, {}, only

    def part(self, name: str, measure, opt_in: bool = False) -> None:
        """Measures one part; `opt_in` parts (minutes of compiling) only when --parts names them."""
        if (self.only or opt_in) and name not in (self.only or ()):
            return
        begun = time.perf_counter()
        try:
            self.data[name] = measure()
        except Exception as error:  # noqa: BLE001 - one part failing must not lose the others
            self.data[name] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        print(
            f"[{time.perf_counter() - begun:6.1f} s] {name}: {json.dumps(self.data[name], default=str)[:600]}"
        )
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1, default=str))


def run(
    pair: str,
    device: torch.device,
    dtype: torch.dtype,
    prompts_n: int,
    prompt_len: int,
    new_tokens: int,
    out,
    only=None,
):
    from engine.decoding.drafters.model import ModelDrafter
    from engine.decoding.verify_cost import VerifyCostCurve
    from engine.runtime.fastpath import FastRunner

    target_name, draft_name = pair.split(":")
    report = Report(out, only)
    max_seq = 1024
    report.part(
        "environment",
        lambda: dict(
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            torch=torch.__version__,
            transformers=__import__("transformers").__version__,
            dtype=str(dtype),
            pair=pair,
            prompts=prompts_n,
            prompt_tokens=prompt_len,
            new_tokens=new_tokens,
        ),
    )
    begun = time.perf_counter()
    target = build_model(target_name, device, dtype, seed=0)
    # the draft's vocabulary padded to the target's (Qwen2.5's differ by padding rows alone): a random
    # target emits ids in those rows, which a trained one never does
    draft = build_model(draft_name, device, dtype, seed=1, vocab_size=CONFIGS[target_name]["vocab_size"])
    built_s = time.perf_counter() - begun
    generator = torch.Generator().manual_seed(0)
    vocab = min(CONFIGS[target_name]["vocab_size"], CONFIGS[draft_name]["vocab_size"])
    prompts = [
        torch.randint(100, vocab, (prompt_len,), generator=generator).tolist() for _ in range(prompts_n)
    ]
    runners = {}

    def memory():
        runners["graphed"] = runner_for(target, device, True, max_seq)
        kv = sum(c.k_cache.numel() * c.k_cache.element_size() * 2 for c in runners["graphed"].fast.kv_caches)
        return dict(
            build_s=round(built_s, 1),
            target_gb=model_bytes(target) / 1e9,
            draft_gb=model_bytes(draft) / 1e9,
            target_kv_gb_per_1k_tokens=kv / max_seq * 1000 / 1e9,
            allocated_gb=torch.cuda.memory_allocated(device) / 1e9 if device.type == "cuda" else None,
        )

    report.part("memory", memory)

    def capture_seconds():
        """What a new runner spends capturing its decode and verify graphs (K up to 8) and a prompt chunk's."""
        runner = runner_for(target, device, True, max_seq)
        begun = time.perf_counter()
        runner.warm_up(sizes=[*range(1, 10), runner.prefill_chunk])
        synchronize(device)
        return dict(seconds=time.perf_counter() - begun, graphs=len(getattr(runner._compiled, "graphs", ())))

    if device.type == "cuda":
        report.part("capture", capture_seconds)
    report.part("hf_plain", lambda: hf_generate(target, prompts, new_tokens, device))
    report.part(
        "tandem_eager",
        lambda: loop_run(runner_for(target, device, False, max_seq), None, prompts, new_tokens, 0, device),
    )
    report.part("tandem_graphed", lambda: loop_run(runners["graphed"], None, prompts, new_tokens, 0, device))

    def outputs_agree():
        reference = report.data["hf_plain"]["outputs"]
        return {
            name: agreement(report.data[name]["outputs"], reference)
            for name in ("tandem_eager", "tandem_graphed")
        }

    report.part("greedy_vs_hf_plain", outputs_agree)

    def exactness_fp32():
        """Greedy tokens of the draft-sized model in float32, where argmaxes are not decided in the last
        bit as they are in bf16 on random weights: Tandem graphed, eager and drafting for itself,
        against transformers' own greedy generate."""
        model = build_model(draft_name, device, torch.float32, seed=2, untie=True)
        reference = hf_generate(model, prompts, 64, device)["outputs"]
        graphed = runner_for(model, device, True, max_seq)
        drafter = drafting_for_itself(model, device, max_seq)
        runs = {
            "graphed": loop_run(graphed, None, prompts, 64, 0, device),
            "eager": loop_run(runner_for(model, device, False, max_seq), None, prompts, 64, 0, device),
            **{f"self_draft_K{k}": loop_run(graphed, drafter, prompts, 64, k, device) for k in (4, 8)},
        }
        return {
            name: {**agreement(run.pop("outputs"), reference), "acceptance": run["acceptance"]}
            for name, run in runs.items()
        }

    report.part("exactness_fp32_vs_hf", exactness_fp32)
    context = prompts[0]
    sizes = list(range(1, MAX_VERIFY + 1))
    report.part(
        "verify_ms",
        lambda: {n: 1000 * t for n, t in step_times(runners["graphed"], context, sizes, 10).items()},
    )
    report.part(
        "verify_ms_eager",
        lambda: {
            n: 1000 * t
            for n, t in step_times(
                runner_for(target, device, False, max_seq), context, [1, 2, 4, 5, 8, 16], 5
            ).items()
        },
    )
    report.part(
        "tree_ms",
        lambda: {
            n: 1000 * t
            for n, t in step_times(runners["graphed"], context, [3, 5, 8, 12, 16], 10, tree=True).items()
        },
    )
    t_verify = (
        {int(n): t / 1000 for n, t in report.data["verify_ms"].items()}
        if "error" not in report.data.get("verify_ms", {"error": 1})
        else None
    )

    drafts = {
        "draft-bf16": lambda: draft,
        "draft-int4": lambda: int4_copy(draft),
        "target-int4": lambda: int4_copy(target),
    }
    draft_runners = {}

    def draft_step(name, make):
        model = make()
        draft_runners[name] = runner_for(model, device, True, max_seq)
        graphed = step_times(draft_runners[name], context, [1], 10)[1]
        eager = step_times(runner_for(model, device, False, max_seq), context, [1], 5)[1]
        return dict(graphed_ms=1000 * graphed, eager_ms=1000 * eager, gb=model_bytes(model) / 1e9)

    for name, make in drafts.items():
        report.part(f"step_{name}", lambda name=name, make=make: draft_step(name, make))

    def norm_kernels():
        """One decode step with the model's own half-precision RMSNorm modules instead of one kernel."""
        from engine.runtime import fused_layer

        times = {}
        for one_kernel in (False, True):
            fused_layer.ONE_KERNEL_NORM_ON_CUDA = one_kernel
            for name, model in (("target", target), ("draft-bf16", draft)):
                step = step_times(runner_for(model, device, True, max_seq), context, [1], 10)[1]
                times[f"{name} {'one kernel' if one_kernel else 'model modules'} ms"] = 1000 * step
        return times

    if device.type == "cuda":
        report.part("norm_kernels", norm_kernels)

    def draft_inductor():
        """The draft's decode step compiled by inductor (reduce-overhead: fused kernels in a CUDA graph)
        against the graph of its eager kernels: at one token a small model's step is bound by kernel
        count. Compiles one shape, a minute or more."""
        runner = FastRunner(draft, device, max_seq, compiled="auto", compile_mode="reduce-overhead")
        begun = time.perf_counter()
        runner.warm_up(sizes=[1])
        compile_s = time.perf_counter() - begun
        token = torch.tensor([context[0]], device=device)
        times = []
        for _ in range(30):
            runner.reset()
            synchronize(device)
            started = time.perf_counter()
            runner.forward(token)
            synchronize(device)
            times.append(time.perf_counter() - started)
        return dict(compile_s=compile_s, step_ms=1000 * statistics.median(times[5:]), notice=runner.notice)

    report.part("draft_inductor", draft_inductor, opt_in=True)
    curve = VerifyCostCurve()
    if t_verify:
        curve.replace(t_verify)

    def self_draft():
        """The target drafting for itself: every draft token is right (up to rounding), so the loop's
        measured speed against the one its measured parts predict is its own overhead."""
        drafter = drafting_for_itself(target, device, max_seq)
        t1, runs = t_verify[1], {}
        for k in (1, 2, 4, 6, 8, None):
            result = loop_run(runners["graphed"], drafter, prompts, new_tokens, k, device, curve)
            result.pop("outputs")
            if k is not None:
                per_round = k * t1 + t_verify[k + 1]
                result["predicted_tok_s"] = result["tokens_per_round"] / per_round
                result["measured_over_predicted"] = result["tok_s"] / result["predicted_tok_s"]
            runs["adaptive" if k is None else f"K={k}"] = result
        return runs

    report.part("loop_self_draft", self_draft)

    def host_syncs():
        """Synchronizing calls per round, counted by torch's sync debug mode (CUDA only), one prompt at
        K = 4; the loop also synchronizes once per round on purpose, to time the draft apart."""
        drafter = drafting_for_itself(target, device, max_seq)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                _, stats = generate_with(runners["graphed"], drafter, prompts[0], new_tokens, 4, curve=curve)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
        return dict(
            rounds=stats.rounds,
            syncs=len(syncs),
            per_round=len(syncs) / max(stats.rounds, 1),
            kinds=sorted(set(syncs))[:8],
        )

    if device.type == "cuda":
        report.part("host_syncs", host_syncs)

    def with_drafts():
        runs = {}
        for name, runner in draft_runners.items():
            drafter = ModelDrafter(runner, target.config.vocab_size, name)
            for k in (4, None):
                result = loop_run(runners["graphed"], drafter, prompts, new_tokens, k, device, curve)
                result["greedy_identical"] = agreement(
                    result.pop("outputs"), report.data["tandem_graphed"]["outputs"]
                )
                runs[f"{name} {'adaptive' if k is None else f'K={k}'}"] = result
        return runs

    report.part("loop_drafts", with_drafts)

    def sampled_self_draft():
        """At T = 0.7 the target drafting for itself: every draft token accepted, as exact sampling must."""
        drafter = drafting_for_itself(target, device, max_seq)
        run = loop_run(runners["graphed"], drafter, prompts[:2], new_tokens, 4, device, curve, 0.7)
        run.pop("outputs")
        return {"K=4": run}

    report.part("loop_sampled_self_draft_T0.7", sampled_self_draft)

    def bounds():
        t_target = t_verify[1]
        result = {}
        for name in drafts:
            step = report.data.get(f"step_{name}", {})
            if "graphed_ms" in step:
                t_draft = step["graphed_ms"] / 1000
                result[name] = {
                    "c": round(t_draft / t_target, 3),
                    **{f"alpha={a}": bound(a, t_target, t_draft, t_verify) for a in ALPHAS},
                }
        return result

    report.part("bound", bounds)
    report.part(
        "hf_assisted_draft", lambda: hf_generate(target, prompts[:2], new_tokens, device, assistant=draft)
    )
    report.part(
        "hf_assisted_self", lambda: hf_generate(target, prompts[:2], new_tokens, device, assistant=target)
    )
    speedups = {}
    plain = report.data.get("hf_plain", {}).get("tok_s")
    for name in ("tandem_eager", "tandem_graphed"):
        if plain and "tok_s" in report.data.get(name, {}):
            speedups[f"{name}_over_hf_plain"] = round(report.data[name]["tok_s"] / plain, 3)
    report.part("summary", lambda: speedups)
    return report.data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pair", default="qwen2.5-7b:qwen2.5-0.5b", help=f"target:draft from {', '.join(CONFIGS)}"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="JSON report, rewritten after each part")
    parser.add_argument("--parts", default="", help="comma-separated parts to run (default: all)")
    args = parser.parse_args(argv)
    for name in args.pair.split(":"):
        if name not in CONFIGS:
            parser.error(f"unknown model {name!r}: choose from {', '.join(CONFIGS)}")
    warnings.filterwarnings("ignore", category=UserWarning)
    run(
        args.pair,
        torch.device(args.device),
        getattr(torch, args.dtype),
        args.prompts,
        args.prompt_tokens,
        args.new_tokens,
        args.out,
        set(filter(None, args.parts.split(","))),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
