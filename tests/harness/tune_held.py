"""`python tests/harness/tune_held.py PHASE ARGS...`: `rocmdoctor ARGS...` held for five minutes once tune
announced PHASE, so that a test can signal it there (tests/system/test_tune_engine.py).

A breakpoint kept out of the product: it wraps tune's event emitter in this process only, the way a
debugger would stop it, and everything else is the real command."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rocmdoctor.cli import main
from rocmdoctor.commands import tune

HOLD_S = 300.0


def held_events(phase: str):
    announce = tune._events

    def events(as_json: bool):
        emit = announce(as_json)

        def emit_and_hold(name: str, **data: Any) -> None:
            emit(name, **data)
            if name == phase:
                # Said once the hold begins, so a test signals a process that is surely held.
                sys.stderr.write(json.dumps({"event": "held", "phase": name}) + "\n")
                sys.stderr.flush()
                time.sleep(HOLD_S)

        return emit_and_hold

    return events


if __name__ == "__main__":
    tune._events = held_events(sys.argv[1])
    sys.argv = ["rocmdoctor", *sys.argv[2:]]
    main()
