"""python.finetune_example: examples/python/finetune.py, tiny: --help exits
0, a bad flag exits 2, 6 steps with --compare-torch print the same last loss
for ferry and torch and a ratio, and a run saved at step 4 and resumed gives
the uninterrupted run's step-6 loss. Usage: finetune_test.py PATH_OF_finetune.py"""
import re
import subprocess
import sys

from common import fail, work_dir

script = sys.argv[1]
tiny = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "2",
        "--log-every", "1"]


def run(*args, rc=0):
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    if p.returncode != rc:
        print(p.stdout, p.stderr)
        fail("finetune.py %s: exit %d, expected %d" % (" ".join(args), p.returncode, rc))
    return p.stdout


if "usage" not in run("--help"):
    fail("--help prints no usage")
run("--steps", "0", rc=2)
out = run("--steps", "6", "--compare-torch", "--warmup", "2", *tiny)
print(out)
m = re.search(r"last loss ferry ([0-9.]+) torch ([0-9.]+)", out)
if not m or abs(float(m.group(1)) - float(m.group(2))) > 1e-4 * float(m.group(2)):
    fail("ferry and torch end at different losses")
if "ratio" not in out:
    fail("no ratio")
d = work_dir("finetune")
full = re.findall(r"step +6/6 +loss ([0-9.]+)", out)
run("--steps", "4", "--save", d, *tiny)
resumed = run("--steps", "6", "--resume", d, *tiny)
print(resumed)
again = re.findall(r"step +6/6 +loss ([0-9.]+)", resumed)
if not full or full != again:
    fail("the resumed run's step-6 loss %s, uninterrupted %s" % (again, full))
print("ok")
