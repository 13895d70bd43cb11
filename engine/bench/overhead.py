"""What serving over HTTP costs per token: the same ChatEngine answering the same prompts in-process
and through `tandem-cli serve`'s app on the loopback (streamed, read by RemoteEngine), interleaved.

    python -m engine.bench.overhead [--repeats 3] [--max-new-tokens 64] [--draft none|ngram]

Every reply is greedy and starts from empty caches, so both paths generate the same tokens; the
figure is (served time - in-process time) / tokens, each time taken around the call that answers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

PROMPTS = [
    "List the days of the week.",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about the sea.",
]


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from engine.models.builtin import DEFAULT_TARGET
    from engine.models.loading import load_model
    from engine.remote import RemoteEngine
    from engine.server.app import create_app
    from engine.server.listen import bind_socket
    from engine.session import ChatEngine
    from engine.settings import SamplingSettings, SpeculationSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft", choices=["none", "ngram"], default="none")
    args = parser.parse_args(argv)

    sampling = SamplingSettings(max_new_tokens=args.max_new_tokens)
    engine = ChatEngine(load_model(DEFAULT_TARGET), None, SpeculationSettings(drafter=args.draft), sampling)
    engine.calibrate()
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, DEFAULT_TARGET, defaults=sampling), log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    remote = RemoteEngine(
        f"http://127.0.0.1:{sock.getsockname()[1]}",
        sampling=SamplingSettings(max_new_tokens=args.max_new_tokens),
    )
    remote.prepare()

    rows = []
    for repeat in range(args.repeats):
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            timed = {}
            order = ("local", "served") if repeat % 2 == 0 else ("served", "local")
            for path in order:
                engine.reset()
                start = time.perf_counter()
                finished = (engine if path == "local" else remote).respond(messages)
                timed[path] = (time.perf_counter() - start, finished.text, finished.stats.generated_tokens)
            (local_s, local_text, tokens), (served_s, served_text, _) = timed["local"], timed["served"]
            if local_text != served_text:
                raise SystemExit(f"served and in-process replies differ for {prompt!r}")
            rows.append(
                {
                    "prompt": prompt,
                    "tokens": tokens,
                    "local_s": local_s,
                    "served_s": served_s,
                    "overhead_ms_per_token": (served_s - local_s) / tokens * 1000,
                }
            )
    remote.close()
    server.should_exit = True
    thread.join(10)
    per_token = [r["overhead_ms_per_token"] for r in rows]
    local_tps = sum(r["tokens"] for r in rows) / sum(r["local_s"] for r in rows)
    served_tps = sum(r["tokens"] for r in rows) / sum(r["served_s"] for r in rows)
    summary = {
        "replies": len(rows),
        "median_overhead_ms_per_token": statistics.median(per_token),
        "local_tokens_per_s": local_tps,
        "served_tokens_per_s": served_tps,
        "served_over_local": served_tps / local_tps,
    }
    print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
