"""Writes tests/module_costs.json (what tests/plugins/schedule.py orders modules by) from the output of
`tests/run -p no:cacheprovider --durations=0`: the seconds of each module's setup, call and teardown.

    tests/run --durations=0 > run.log; .venv/bin/python tests/bench/module_costs.py run.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::")
OUT = Path(__file__).resolve().parent.parent / "module_costs.json"


def main(log: str) -> None:
    costs: Counter[str] = Counter()
    for line in Path(log).read_text().splitlines():
        match = LINE.match(line)
        if match:
            costs[match.group(2)] += float(match.group(1))
    document = {
        "_about": json.loads(OUT.read_text())["_about"] if OUT.exists() else "",
        "modules": {name: round(seconds) for name, seconds in costs.most_common() if seconds >= 5},
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
