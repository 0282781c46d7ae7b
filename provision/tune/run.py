"""`rocmdoctor tune`'s runner: one vLLM server per setting, started as `serve` starts it, measured, stopped.

Each setting gets its own server (the setting is a server flag), started by `serve.Server` with the
command line `unit`/`serve` compute plus the setting's flags, tethered (`host_processes.ProcessGroup`):
the server's process group dies with tune even when tune is SIGKILLed. Readiness is `serve`'s (/health
and a real completion) within `start_timeout_s`; a start that fails is a point with an error, never a
hang. The server is stopped in a `finally` on every way out, a signal turned into an exception by the
command included.

On each server: a warm-up round (the first one also fills the compile and JIT caches, so only the
first start is cold), then the measured round: `requests` (at least ROUNDS per sequence slot) requests
with at most max-num-seqs in flight, so the client never holds back what the server could batch and
never queues what it cannot (vLLM's `--link-vars max_num_seqs=max_concurrency`). Latencies are
`bench`'s (vLLM's definitions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rocmdoctor.provision.server.serve import MARKER, Server, new_marker
from rocmdoctor.provision.tune.search import PERCENTILES, Measurement, Setting
from rocmdoctor.provision.tune.workload import Workload, request_bodies
from rocmdoctor.provision.verify import bench
from rocmdoctor.provision.verify import openai_client as oc

Events = Callable[..., None]
# Measured requests per setting: at least this many rounds of max-num-seqs. With two rounds the last
# round's stragglers are half the window, and throughput at neighbouring settings differed by 2x on a
# shared 2-core host (tests/bench/tune_vs_sweep.py, first run); four rounds halve that tail.
ROUNDS = 4
WARMUP_REQUESTS = 2  # per sequence slot, at least; the first server's also warm the caches


@dataclass
class RunOptions:
    executable: Path
    argv: list[str]  # the server's command line without the tuned flags
    env: dict[str, str]  # without the marker: each start gets its own
    base_url: str
    served_name: str
    api_key: str | None
    log_dir: Path
    workload: Workload
    start_timeout_s: float = 600.0
    request_timeout_s: float = 120.0
    requests: int = 16  # measured per setting, at least ROUNDS x max-num-seqs
    min_seconds: float = 0.0  # more batches of requests until the measuring took this long
    warmup_requests: int = 4


def latency_summary(results: list[bench.RequestResult]) -> dict[str, dict[str, float]]:
    done = [r for r in results if r.ok]
    series = {
        "ttft": [r.ttft_s for r in done if r.ttft_s is not None],
        "itl": [gap for r in done for gap in r.itl_s],
        "tpot": [t for r in done if (t := r.tpot_s) is not None],
        "e2el": [r.e2el_s for r in done if r.e2el_s is not None],
    }
    return {
        metric: {f"p{p}": round(bench.percentile(values, p) * 1000, 3) for p in PERCENTILES}
        for metric, values in series.items()
        if values
    }


def summarize(setting: Setting, results: list[bench.RequestResult], duration_s: float) -> Measurement:
    done = [r for r in results if r.ok]
    errors = sorted({r.error for r in results if not r.ok})
    return Measurement(
        setting,
        sum(r.output_tokens for r in done) / duration_s if duration_s > 0 else 0.0,
        len(results),
        len(results) - len(done),
        latency_summary(results),
        duration_s,
        error="; ".join(errors[:3]),
    )


@dataclass
class Runner:
    options: RunOptions
    events: Events = field(default=lambda phase, **data: None)
    starts: int = 0
    trial: int = 0
    servers: list[Server] = field(default_factory=list)

    def server_for(self, setting: Setting) -> Server:
        env = dict(self.options.env)
        server = Server(
            self.options.executable,
            [*self.options.argv, *setting.flags()],
            self.options.base_url,
            self.options.served_name,
            {**env, MARKER: new_marker()},
            self.options.log_dir / f"tune-{self.starts + 1}-seqs{setting.max_num_seqs}.log",
            tether=True,
        )
        return server

    def measure(self, setting: Setting) -> Measurement:
        """Start a server with `setting`, warm it, measure it, stop it (on every way out)."""
        server = self.server_for(setting)
        self.starts += 1
        self.servers.append(server)
        cold = self.starts == 1
        try:
            try:
                server.start()
            except OSError as exc:
                return Measurement(
                    setting, 0.0, error=f"cannot start {server.executable}: {exc.strerror or exc}"
                )
            # Announced once the server runs: a stop from here on has a process group to stop.
            self.events("starting", setting=setting.to_json(), log=str(server.log_path), cold=cold)
            outcome = server.wait_ready(self.options.start_timeout_s)
            if not outcome.ready:
                why = outcome.reason + (f" ({outcome.cause.summary})" if outcome.cause else "")
                return Measurement(setting, 0.0, start_seconds=outcome.seconds, error=why)
            point = asyncio.run(self._measure(setting, cold))
            point.start_seconds = outcome.seconds
            return point
        except bench.BenchAborted as exc:
            return Measurement(setting, 0.0, error=str(exc.error))
        finally:
            left = server.stop()
            self.events("stopped", setting=setting.to_json(), leftover_pids=left)

    async def _measure(self, setting: Setting, cold: bool) -> Measurement:
        opts = self.options
        slots = setting.max_num_seqs
        client_server = oc.Server(opts.base_url, opts.api_key, opts.request_timeout_s)
        async with oc.open_client(client_server, connections=slots) as client:
            model = await bench.resolve_model(client, opts.served_name)
            ids = await bench.prompt_ids(client, model) if opts.workload.synthetic else None
            self.events("warm-up", setting=setting.to_json(), cold_caches=cold)
            self.trial += 1
            warm = request_bodies(opts.workload, model, ids, max(opts.warmup_requests, slots), self.trial)
            results, _ = await bench.run_requests(client, warm, slots)
            if not any(r.ok for r in results):
                return Measurement(setting, 0.0, error=f"the warm-up failed: {results[0].error}")
            self.events("measuring", setting=setting.to_json())
            # Batches of fresh requests until min_seconds of measuring: a stall of the host (another
            # job's burst) is then a small part of the window, not half of it.
            results, duration = [], 0.0
            while not results or (duration < opts.min_seconds and all(r.ok for r in results)):
                self.trial += 1
                count = max(opts.requests, ROUNDS * slots)
                bodies = request_bodies(opts.workload, model, ids, count, self.trial)
                batch, seconds = await bench.run_requests(client, bodies, slots)
                results += batch
                duration += seconds
            point = summarize(setting, results, duration)
            point.seconds = duration
            return point
