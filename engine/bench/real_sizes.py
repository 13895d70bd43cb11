"""What a GGUF target costs at real sizes: random-weight models built from published configs, turned
into GGUF files by llama.cpp's own tools, then loaded and decoded by Tandem and by llama.cpp.

    python -m engine.bench.real_sizes --models llama-3.2-1b,qwen2.5-1.5b,llama-3.1-8b \
        --types Q4_K_M,Q8_0 --work /path/with/space --json real-sizes.json

For each model: its config (written out here: no hub is reached) builds a model without weights, whose
tensors are filled with random bf16 values and saved shard by shard (an 8B model never sits in memory
whole); llama.cpp's convert_hf_to_gguf.py turns the folder into a bf16 GGUF, and llama-quantize into
each type asked for (packaging/build_llama_cpp.sh builds it; the converter needs `pip install
sentencepiece`). The tokenizer is the built-in model's, padded to the config's vocabulary by the
converter, so the embedding and LM head have their real size; its pre-tokenizer is named to the
converter as the built-in's, whatever the config's family (Qwen2.5's included).

For each file, in a process of its own: Tandem's load time, the process's peak RSS beyond what it held
before loading (its VmHWM), the file's size, decode speed (one-token steps after a 64-token
prompt) and verify cost t(K)/t(1); then llama-bench on the same file (tg and pp, same threads). Load
cost, memory and step times are real on such files; acceptance is not (the weights are random), so no
drafting is measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# the published configs measured here (engine.bench.random_pair.CONFIGS)
MODELS = ("llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b")
SHARD_BYTES = 2 << 30
PROMPT_TOKENS = 64
VERIFY_SIZES = (1, 2, 4, 8)


def llama_cpp_source() -> Path:
    import importlib.util

    from engine.bench.llama_cpp import llama_server_path

    if importlib.util.find_spec("sentencepiece") is None:
        raise SystemExit("llama.cpp's converter needs sentencepiece: .venv/bin/pip install sentencepiece")

    prefix = llama_server_path().parents[1]  # .venv/llama.cpp
    found = sorted((prefix / "src").glob("unpacked/*/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise SystemExit(
            f"llama.cpp's source is not unpacked under {prefix}/src: run packaging/build_llama_cpp.sh"
        )
    return found[0].parent


def random_folder(name: str, folder: Path) -> Path:
    """A safetensors folder of random bf16 weights for config `name`, written shard by shard."""
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.bench.random_pair import CONFIGS
    from engine.models.builtin import DEFAULT_TARGET, ensure_builtin

    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fields = dict(CONFIGS[name])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, torch_dtype="bfloat16")
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[config.model_type]]
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    generator = torch.Generator().manual_seed(0)
    shard, size, index = {}, 0, {}

    def flush() -> None:
        nonlocal shard, size
        if shard:
            file = f"model-{len(set(index.values())) + 1:05d}.safetensors"
            save_file(shard, str(folder / file), metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, file))
            shard, size = {}, 0

    for key, shape in shapes.items():
        if key.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        shard[key] = tensor
        size += tensor.numel() * 2
        if size >= SHARD_BYTES:
            flush()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    config.save_pretrained(str(folder))
    tokenizer_folder = ensure_builtin(DEFAULT_TARGET)
    for file in tokenizer_folder.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(file, folder / file.name)
    return folder


# llama.cpp's converter names a BPE pre-tokenizer from a hash of how the tokenizer splits a test text;
# with a qwen2 config the built-in tokenizer loads as Qwen2's class, whose hash it does not know. The
# tokenizer is the built-in model's whatever the config, so its pre-tokenizer is named as such.
CONVERT = """
import sys
from pathlib import Path
source = Path(sys.argv.pop(1))
sys.path[:0] = [str(source), str(source / "gguf-py")]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
import runpy
sys.argv[0] = str(source / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def gguf_files(name: str, types: list[str], work: Path) -> dict[str, Path]:
    """The model's GGUF file per type, converted and quantized where missing."""
    from engine.bench.llama_cpp import llama_server_path

    source = llama_cpp_source()
    quantize = llama_server_path().with_name("llama-quantize")
    wanted = {kind: work / f"{name}-{kind}.gguf" for kind in types}
    if all(path.is_file() for path in wanted.values()):
        return wanted
    bf16 = work / f"{name}-bf16.gguf"
    if not bf16.is_file():
        folder = random_folder(name, work / f"{name}-hf")
        run(
            [
                sys.executable,
                "-c",
                CONVERT,
                str(source),
                str(folder),
                "--outtype",
                "bf16",
                "--outfile",
                str(bf16),
            ]
        )
        shutil.rmtree(folder)
    for kind, path in wanted.items():
        if not path.is_file():
            run([str(quantize), str(bf16), str(path), kind, str(os.cpu_count() or 2)])
    bf16.unlink()
    return wanted


def run(command: list[str]) -> None:
    print("$", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


MEASURE = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from engine.models.loading import load_model
from engine.runtime.fastest_runner import make_runner
def peak_rss():  # this process's own high-water mark (ru_maxrss would keep the parent's across exec)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
before = peak_rss()
start = time.perf_counter()
loaded = load_model(sys.argv[1], device="cpu")
load_s = time.perf_counter() - start
after_load = peak_rss()
runner = make_runner(loaded.model, compiled="off")
prompt = [(1000 + i) % runner.vocab_size for i in range(PROMPT_TOKENS)]
seconds = {}
with torch.inference_mode():
    runner.reset(); runner.prefill(prompt)
    for k in VERIFY_SIZES:
        times = []
        for _ in range(int(sys.argv[3])):
            runner.rollback(len(prompt))
            t = time.perf_counter(); runner.forward([5] * k); times.append(time.perf_counter() - t)
        seconds[k] = min(times)
peak = peak_rss()
print(json.dumps({"load_s": load_s, "rss_before": before, "added_by_load": after_load - before,
                  "added_with_kv": peak - before, "kv_cache_bytes": sum(b.numel() * b.element_size() for n, b in runner.fast.named_buffers() if "cache" in n) if hasattr(runner, "fast") else None,
                  "step_s": seconds, "precision": loaded.info.get("precision"), "notice": runner.notice}))
"""


def measure_tandem(path: Path, threads: int, repeats: int) -> dict:
    script = MEASURE.replace("PROMPT_TOKENS", str(PROMPT_TOKENS)).replace("VERIFY_SIZES", repr(VERIFY_SIZES))
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), str(threads), str(repeats)], capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    steps = {int(k): v for k, v in result.pop("step_s").items()}
    result["decode_tokens_per_s"] = 1 / steps[1]
    result["verify_cost"] = {k: steps[k] / steps[1] for k in steps}
    return result


def measure_llama_cpp(path: Path, threads: int) -> dict:
    from engine.bench.llama_cpp import llama_server_path

    bench = llama_server_path().with_name("llama-bench")
    done = subprocess.run(
        [
            str(bench),
            "-m",
            str(path),
            "-t",
            str(threads),
            "-p",
            str(PROMPT_TOKENS),
            "-n",
            "32",
            "-r",
            "3",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-300:]}
    rows = json.loads(done.stdout)
    speeds = {("pp" if row["n_prompt"] else "tg"): row["avg_ts"] for row in rows}
    return {"decode_tokens_per_s": speeds.get("tg"), "prompt_tokens_per_s": speeds.get("pp")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--types", default="Q4_K_M,Q8_0")
    parser.add_argument("--work", type=Path, required=True, help="a folder with room for the files")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models.split(","):
        for kind, path in gguf_files(name, args.types.split(","), args.work).items():
            row = {"model": name, "type": kind, "file_bytes": path.stat().st_size}
            row["tandem"] = measure_tandem(path, args.threads, args.repeats)
            row["llama_cpp"] = measure_llama_cpp(path, args.threads)
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
