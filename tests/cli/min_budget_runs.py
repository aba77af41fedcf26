#!/usr/bin/env python3
"""tests/cli/min_budget_runs.py — ferry-gpt trains at the planner's minimum
budgets, run after run, and never fails for room.

The thin Llama of family_bytes.py (24 blocks, 26 groups, one 512 KiB
embedding chunk among 64 KiB chunks) trains through
examples/configs/zero-infinity.cfg on the host backend at the
zero-infinity candidate's device and host budgets from `ferry plan`, for
each optimizer layout in turn, under the pools' fit policies in turn
(first, last, random with the run's seed): where a copy lands may change
the bytes moved, never whether a step fits. Every run must finish all its
steps. The held copies of mixed sizes once left the host pool's free room
in holes none of which fitted the embedding's chunk (about one run in 30
under ASan).

usage: min_budget_runs.py --gpt FERRY-GPT --ferry FERRY --root REPO --work DIR [--runs N]
                          [--steps N]
exit: 0 every run finished, 1 a run failed (its stderr printed), 2 set-up failed.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_bytes as fb  # noqa: E402  (the model, the data and ferry plan)

FITS = ("first", "last", "random")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    for k in ("gpt", "ferry", "root", "work"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    os.makedirs(a.work, exist_ok=True)
    a.seq, a.chunk, a.profile = 64, "64K", None
    a.model = os.path.join(a.work, "thin-llama.json")
    with open(a.model, "w") as f:
        fb.json.dump(fb.MODEL, f)
    a.data = os.path.join(a.work, "tokens.u32")
    vocab = fb.MODEL["vocab_size"]
    with open(a.data, "wb") as f:
        f.write(b"".join(((i * i * 7 + i * 13) % vocab).to_bytes(4, "little")
                         for i in range(8 * (a.seq + 1) * 4)))
    layouts = list(fb.LAYOUTS)
    budgets = {}
    for layout in layouts:
        _, c = fb.plan(a, layout, 1 << 40, 1 << 40)
        budgets[layout] = (c["tiers"]["gpu"]["bytes"], c["tiers"]["host"]["bytes"])
    failed = 0
    for i in range(a.runs):
        layout, fit = layouts[i % len(layouts)], FITS[(i // len(layouts)) % len(FITS)]
        gpu, host = budgets[layout]
        p = fb.train_process(a, layout, gpu, host, ["fit=" + fit, "fit_seed=%d" % (i + 1)])
        steps = sum(1 for l in p.stdout.splitlines() if l.startswith('{"step"'))
        ok = p.returncode == 0 and steps == a.steps
        print("min_budget_runs: run %d: %-5s fit %-6s gpu %d host %d: %s"
              % (i + 1, layout, fit, gpu, host,
                 "ok" if ok else "FAILED (exit %d, %d steps)" % (p.returncode, steps)))
        if not ok:
            failed += 1
            sys.stdout.write(p.stderr[-4000:])
    print("min_budget_runs: %d of %d runs failed" % (failed, a.runs))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
