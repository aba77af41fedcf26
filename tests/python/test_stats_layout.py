"""python.stats_layout: the ctypes mirrors of ferry_stats, ferry_step_info,
ferry_checkpoint_options, ferry_checkpoint_info and ferry_device_info have
the C compiler's size and field offsets (stats_layout.c prints them), and
every C field has a mirror. Usage: test_stats_layout.py PATH_OF_python_stats_layout"""
import subprocess
import sys

from common import fail

from ferry import _lib

out = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
c = dict((k, int(v)) for k, v in (line.split() for line in out.splitlines()))
checked = 0
for key, val in c.items():
    sname, _, field = key.partition(".")
    st = _lib.STRUCTS.get(sname)
    if st is None:
        fail("no ctypes mirror of %s" % sname)
    got = __import__("ctypes").sizeof(st) if not field else getattr(st, field, None)
    if field and got is None:
        fail("%s has no field %s in the mirror" % (sname, field))
    if field:
        got = got.offset
    if got != val:
        fail("%s: C says %d, ctypes %d" % (key, val, got))
    checked += 1
for sname, st in _lib.STRUCTS.items():
    for f, _ in st._fields_:
        if "%s.%s" % (sname, f) not in c:
            fail("%s.%s is not in stats_layout.c" % (sname, f))
print("ok: %d sizes and offsets match" % checked)
