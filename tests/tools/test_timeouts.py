#!/usr/bin/python3
"""tests/tools/test_timeouts.py — the test-time rule, read from ctest itself:
every test outside the label `slow` has a TIMEOUT of at most LIMIT seconds
(`./ferry.sh test` runs them; `./ferry.sh test --slow` runs the others), and
every slow test is in the label because a shorter version of it runs in CI
(a test NAME.full beside NAME).

usage: test_timeouts.py CTEST BUILD_DIR [LIMIT]   (LIMIT: 120)
exit: 0 pass, 1 a test breaks the rule, 2 ctest did not answer.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    ctest, build = sys.argv[1], sys.argv[2]
    limit = float(sys.argv[3]) if len(sys.argv) == 4 else 120.0
    # ctest run in the build folder would write a new Testing/Temporary/
    # LastTest.log over the one of the run this test is part of: it reads
    # a copy of the build's CTestTestfile.cmake files instead
    with tempfile.TemporaryDirectory() as tree:
        for top, dirs, files in os.walk(build):
            dirs[:] = [d for d in dirs if d != "Testing"]
            if "CTestTestfile.cmake" in files:
                to = os.path.join(tree, os.path.relpath(top, build))
                os.makedirs(to, exist_ok=True)
                shutil.copy(os.path.join(top, "CTestTestfile.cmake"), to)
        p = subprocess.run([ctest, "--test-dir", tree, "--show-only=json-v1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print("test_timeouts: ctest --show-only exited %d: %s" % (p.returncode, p.stderr))
        return 2
    tests = json.loads(p.stdout)["tests"]
    names = {t["name"] for t in tests}
    bad, slow = 0, 0
    for t in tests:
        props = {q["name"]: q["value"] for q in t.get("properties", [])}
        labels = props.get("LABELS", [])
        timeout = props.get("TIMEOUT")
        if "slow" in labels:
            slow += 1
            short = t["name"][:-len(".full")] if t["name"].endswith(".full") else None
            if short not in names:
                print("test_timeouts: %s is slow but has no CI-sized NAME beside NAME.full"
                      % t["name"])
                bad += 1
            continue
        if timeout is None or timeout > limit:
            print("test_timeouts: %s: TIMEOUT %s, above %g s outside the label slow"
                  % (t["name"], timeout, limit))
            bad += 1
    print("test_timeouts: %d tests, %d slow; %s" % (len(tests), slow,
                                                   "FAILED" if bad else "passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
