"""Size the KV cache of several models in one interpreter of the vLLM venv, the way `vllm serve` does.

Run by tests/system/test_plan_engine.py as `<vllm python> kv_capacity.py CASES_JSON`, where each case is
{"name": ..., "argv": [the server's engine arguments]}. For each case it builds vLLM's engine in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0: no worker process, no HTTP server) with the OpenAI server's
usage context, up to the point where vLLM has logged the KV cache size, concurrency and block sizes, then
tears it down. Its stdout is vLLM's own log, each case between `=== CASE name` and `=== DONE name` lines.
Importing vLLM once for all cases instead of twice per case (server and engine core) is what makes the
plan's engine check take about a minute instead of eight.
"""

from __future__ import annotations

import gc
import json
import sys


def main() -> None:
    import vllm.logger
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    once = ("_print_debug_once", "_print_info_once", "_print_warning_once", "_print_error_once")
    for case in json.loads(sys.argv[1]):
        # vLLM logs some of the lines the test reads once per process: every case must log its own.
        for name in once:  # the set differs by version (0.20.1 has no _print_error_once)
            if hasattr(vllm.logger, name):
                getattr(vllm.logger, name).cache_clear()
        print(f"=== CASE {case['name']}", flush=True)
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        args = EngineArgs.from_cli_args(parser.parse_args(case["argv"]))
        try:
            engine = LLMEngine.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
            del engine
        except Exception as exc:  # a refusal is what some cases are for: its message is the result
            print(f"=== REFUSED {case['name']}: {type(exc).__name__}: {exc}", flush=True)
        cleanup_dist_env_and_memory()
        gc.collect()
        print(f"=== DONE {case['name']}", flush=True)


if __name__ == "__main__":
    main()
