"""How fast a prompt is read: Tandem's target and llama.cpp's `llama-bench -p N` on the same GGUF file,
the same prompt lengths and threads, in one run.

Tandem's figure is the engine's own path for a new conversation: the prompt fed in 512-token chunks
(engine.decoding.speculative.prefill) through the runner a reply uses, no drafting, from an empty
cache, the fastest of `--repeats` runs after one that warms the shapes up (other load only adds
time). llama.cpp's is llama-bench's average prompt speed over its own repeats.

    python -m engine.bench.prefill_speed --tokens 512,4096 --json prefill.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from engine.models.builtin import DEFAULT_TARGET


def tandem_prompt_speed(spec: str, lengths: list[int], threads: int, repeats: int) -> dict[int, float]:
    """Prompt tokens per second through ChatEngine's target runner, per prompt length."""
    import torch

    from engine.decoding.speculative import prefill
    from engine.models.loading import load_model
    from engine.runtime.fastest_runner import make_runner
    from engine.settings import SamplingSettings, cache_tokens_for

    torch.set_num_threads(threads)
    target = load_model(spec, device="cpu")
    tokens = cache_tokens_for(target.model.config, max(lengths) + 64)
    runner, greedy = (
        make_runner(target.model, compiled="off", tokens=tokens),
        SamplingSettings(temperature=0.0),
    )
    speeds = {}
    with torch.inference_mode():
        for n in lengths:
            prompt = [(1000 + 7 * i) % runner.vocab_size for i in range(n)]
            best = float("inf")
            for _ in range(repeats + 1):
                runner.reset()
                start = time.perf_counter()
                prefill(runner, prompt, greedy, None)
                best = min(best, time.perf_counter() - start)
            speeds[n] = n / best
    return speeds


def llama_prompt_speed(path: Path, lengths: list[int], threads: int) -> dict[int, float]:
    """llama-bench's prompt tokens per second, per prompt length."""
    from engine.bench.llama_cpp import llama_server_path

    bench = llama_server_path().with_name("llama-bench")
    command = [str(bench), "-m", str(path), "-t", str(threads), "-n", "0", "-r", "3", "-o", "json"]
    command += ["-p", ",".join(str(n) for n in lengths)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return {int(row["n_prompt"]): float(row["avg_ts"]) for row in json.loads(done.stdout) if row["n_prompt"]}


def main(argv: list[str] | None = None) -> int:
    from engine.bench.llama_cpp import gguf_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, help="a GGUF file or the built-in model")
    parser.add_argument("--tokens", default="512,4096", help="prompt lengths, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.tokens.split(",")]
    path = gguf_for(args.target)
    ours = tandem_prompt_speed(args.target, lengths, args.threads, args.repeats)
    theirs = llama_prompt_speed(path, lengths, args.threads)
    rows = [
        {
            "prompt_tokens": n,
            "tandem_tokens_per_s": round(ours[n], 1),
            "llama_cpp_tokens_per_s": round(theirs[n], 1),
            "ratio": round(ours[n] / theirs[n], 3),
        }
        for n in lengths
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"file": str(path), "threads": args.threads, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
