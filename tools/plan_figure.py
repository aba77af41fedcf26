#!/usr/bin/env python3
"""tools/plan_figure.py — figures of `ferry plan --json` for the docs'
inline figures (tools/gen_docs.py), in the units the plan's text prints.

  tools/plan_figure.py FORMAT [PLAN ARGS...]

runs `ferry plan PLAN ARGS --json` (ferry from PATH) and prints FORMAT with
each {PATH:UNIT} replaced. PATH walks the JSON object by keys joined with
'.'; in a list of candidates a key is a placement name
(candidates.nvme-optimizer.step_seconds); PATH+PATH is their sum. UNIT: gib (bytes as GiB, one
decimal: "4.3"; gib2: two), s (seconds, three decimals), n (an integer
with thousands commas), m / g (in millions / billions, one / two decimals:
"10.8", "68.98"), or none (the value as it is). `ferry plan` exiting 1 (nothing fits) still prints its JSON.
"""
import json
import re
import subprocess
import sys

UNITS = {
    "gib": lambda v: f"{v / 2**30:.1f}",
    "gib2": lambda v: f"{v / 2**30:.2f}",
    "s": lambda v: f"{v:.3f}",
    "n": lambda v: f"{int(v):,}",
    "m": lambda v: f"{v / 1e6:.1f}",
    "g": lambda v: f"{v / 1e9:.2f}",
    "": lambda v: str(v).lower() if isinstance(v, bool) else str(v),
}


def walk(obj, path):
    for key in path.split("."):
        if isinstance(obj, list):
            match = [c for c in obj if isinstance(c, dict) and c.get("placement") == key]
            obj = match[0] if match else obj[int(key)]
        else:
            obj = obj[key]
    return obj


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    p = subprocess.run(["ferry", "plan", *sys.argv[2:], "--json"], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.stderr.write(p.stderr)
        return 2
    plan = json.loads(p.stdout)

    def one(m):
        parts = [walk(plan, k) for k in m.group(1).split("+")]
        return UNITS[m.group(2) or ""](sum(parts) if len(parts) > 1 else parts[0])

    try:
        print(re.sub(r"\{([^{}:]+)(?::(\w+))?\}", one, sys.argv[1]))
    except (KeyError, IndexError, ValueError, TypeError) as e:
        print(f"plan_figure: {sys.argv[1]}: no such figure in the plan ({e!r})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
