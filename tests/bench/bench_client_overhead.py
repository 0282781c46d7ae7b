"""How much CPU the bench client itself spends per streamed token.

`rocmdoctor bench` must not be the bottleneck it measures. This drives the bench's own client code
(`run_level`: aiohttp streaming, SSE parsing, timing, percentiles) with many concurrent streams
against the fake OpenAI server in a separate process, and divides the client process's CPU time
(time.process_time: user + system, all threads) by the tokens received.

    .venv/bin/python tests/bench/bench_client_overhead.py [--streams 64] [--requests 256] [--tokens 256]
        [--token-delay 0]   # seconds between tokens on the server; 0 = as fast as it can

Run from the repository root. Figures and the command that produced them: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.fake_openai import fake_server
from rocmdoctor.provision.verify import openai_client as oc
from rocmdoctor.provision.verify.bench import run_level


async def measure(base_url: str, streams: int, requests: int, tokens: int) -> dict:
    async with oc.open_client(oc.Server(base_url, None, 120.0), connections=streams) as client:
        bodies = [
            {"model": "tiny", "prompt": [11, 12, 13, 14], "max_tokens": tokens, "ignore_eos": True}
            for _ in range(requests)
        ]
        await run_level(client, bodies[:streams], streams)  # connections open, caches warm
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        level = await run_level(client, bodies, streams)
        cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
    received = level["output_tokens"]
    return {
        "streams": streams,
        "requests": requests,
        "tokens_per_request": tokens,
        "failures": level["failures"],
        "tokens_received": received,
        "wall_s": round(wall_s, 3),
        "client_cpu_s": round(cpu_s, 3),
        "client_user_s": round(usage_after.ru_utime - usage_before.ru_utime, 3),
        "client_sys_s": round(usage_after.ru_stime - usage_before.ru_stime, 3),
        "client_cpu_us_per_token": round(cpu_s / received * 1e6, 2),
        "tokens_per_s_received": round(received / wall_s, 1),
        "client_cpu_share_of_wall": round(cpu_s / wall_s, 3),
        # what one fully busy core of this client could absorb: the ceiling the client puts on a figure
        "client_ceiling_tokens_per_s_one_core": round(received / cpu_s, 0),
        "itl_p50_ms": level["itl_ms"]["p50"],
        "tpot_p50_ms": level["tpot_ms"]["p50"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--token-delay", type=float, default=0.0)
    args = parser.parse_args()
    with fake_server("--token-delay", str(args.token_delay)) as server:
        result = asyncio.run(measure(server.base_url, args.streams, args.requests, args.tokens))
    result["token_delay_s"] = args.token_delay
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
