"""A stand-in for `vllm-server` in one instance of vllm@.service: it takes vLLM's command line, records
what the instance was started with (argv and the device-visibility environment) in the unit's state
directory, and serves the fake OpenAI protocol on the instance's --port, so the unit's readiness
gate and the test's requests talk to a real socket. The real engine is covered by
test_unit_systemd.py; here the point is the template, the target and the per-instance files.

usage: python -m harness.instance_server --port N --served-model-name NAME [any vLLM flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from harness.fake_openai import Behaviour, serve

RECORDED_ENV = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "VLLM_API_KEY")
STATE = Path("/var/lib/vllm")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    args, _rest = parser.parse_known_args()
    record = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in RECORDED_ENV}, "pid": os.getpid()}
    (STATE / f"instance-{args.port}.json").write_text(json.dumps(record))
    # A POSIX shared-memory object as vLLM's engine keeps (its message queues live in /dev/shm):
    # RemoveIPC=yes must not take it away while another instance of the same user still runs.
    Path(f"/dev/shm/rack-instance-{args.port}").write_bytes(b"x")
    behaviour = Behaviour("ok", args.served_model_name, os.environ.get("VLLM_API_KEY"))
    asyncio.run(serve(behaviour, args.port))


if __name__ == "__main__":
    main()
