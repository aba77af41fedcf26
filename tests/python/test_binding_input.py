"""python.binding_input: what the binding hands to C is what the caller meant,
or a clear ferry.Error. A NUL inside a config key, a value, a param name or a
path is refused (FERRY_EINVAL), never cut short; a bytes path is the path,
not the text "b'/x'"; Config.get returns a value longer than 4095
characters whole; Engine.register refuses a values buffer of another
length or item type; the memoryview an init callback gets is released
when the callback returns (reading it later raises, it does not read freed
memory), and one that still has a view made over it fails finalize; a
second thread calling into an engine while another is inside gets
FERRY_EBUSY. Runs without torch."""
import array
import atexit
import ctypes
import os
import shutil
import sys
import tempfile
import threading

if os.environ.get("FERRY_SANITIZE"):
    print("skip: a sanitizer build's libferry.so cannot be loaded into python")
    sys.exit(77)

import ferry  # noqa: E402
from checks import expect, fail  # noqa: E402

BASE = {"device": "host", "tiers.gpu.budget": "64K", "tiers.host.budget": "16M",
        "tiers.host.pinned": False, "chunk_size": "4K", "placement.params": "host",
        "placement.optimizer": "host", "precision.params": "fp32", "optimizer.threads": 1}
_base = os.environ.get("FERRY_TEST_TMP") or tempfile.gettempdir()
os.makedirs(_base, exist_ok=True)  # the first python test of a clean build makes it
tmp = tempfile.mkdtemp(prefix="binding-", dir=_base)
atexit.register(shutil.rmtree, tmp, True)

# NUL bytes: C would stop at them
c = ferry.Config(BASE)
expect(lambda: c.set("optimizer.lr\0junk", 0.5), ferry.EINVAL, "NUL")
expect(lambda: c.set("optimizer.type", "sgd\0adamw"), ferry.EINVAL, "NUL")
expect(lambda: c.write_file(os.path.join(tmp, "a.cfg\0b")), ferry.EINVAL, "NUL")
expect(lambda: c.load_string('device = "host";\0 zzz = 1;'), ferry.EINVAL, "NUL")
if c.get("optimizer.type") != "adamw":
    fail("a refused value changed optimizer.type to %r" % c.get("optimizer.type"))

# bytes paths are paths
p = os.path.join(tmp, "c.cfg")
c.write_file(p.encode())
ferry.Config(p.encode())  # a bytes source is a file
c2 = ferry.Config(BASE, {"tiers.nvme.paths": [b"/x", os.fsencode(tmp)]})
got = c2.get("tiers.nvme.paths")
print("paths:", got)
if "b'" in got or "/x" not in got or tmp not in got:
    fail("bytes paths became %r" % got)

# Config.get: the whole value
long_paths = [os.path.join(tmp, "d%02d" % k + "x" * 400) for k in range(16)]
c.set("tiers.nvme.paths", long_paths)
got = c.get("tiers.nvme.paths")
print("Config.get: %d characters" % len(got))
if len(got) <= 4095 or long_paths[-1] not in got:
    fail("Config.get gave %d characters, without the last path" % len(got))

eng = ferry.Engine(BASE)
# values buffers: the length and the item type are checked
expect(lambda: eng.register("short", [4, 4], 0, values=array.array("f", [1.0] * 15)),
       ferry.EINVAL, "short", "64 bytes")
expect(lambda: eng.register("long", [4, 4], 0, values=array.array("f", [1.0] * 17)),
       ferry.EINVAL, "long")
expect(lambda: eng.register("f64", [4, 4], 0, values=array.array("d", [1.0] * 8)),
       ferry.EINVAL, "f64", "'d'")
expect(lambda: eng.register("w\0x", [4, 4], 0), ferry.EINVAL, "NUL")
eng.register("ok", [4, 4], 0, values=array.array("f", [0.5] * 16))

# the init view is released when the callback returns
kept = []
busy = []


def init(name, mv):
    for i in range(len(mv)):
        mv[i] = 0.25
    kept.append(mv)
    # a second thread while this one is inside the engine (finalize)
    def other():
        try:
            eng.loss_scale()
            busy.append("no error")
        except ferry.Error as e:
            busy.append(e)
    t = threading.Thread(target=other, name="second")
    t.start()
    t.join()


eng.register("viewed", [8], 1, init=init)
eng.finalize()
try:
    kept[0][0]
    fail("the init callback's memoryview can still be read after finalize")
except ValueError as e:
    print("released:", e)
print("second thread:", busy[0])
if not isinstance(busy[0], ferry.Error) or busy[0].status != ferry.EBUSY or \
        "one thread" not in str(busy[0]):
    fail("a second thread inside the engine got %r, not FERRY_EBUSY" % (busy[0],))
out = eng.param_read("viewed", count=8)
if list(out) != [0.25] * 8:
    fail("init values %s" % list(out))
expect(lambda: eng.param_read("viewed\0", count=8), ferry.EINVAL, "NUL")
expect(lambda: eng.checkpoint_save(os.path.join(tmp, "ck\0pt")), ferry.EINVAL, "NUL")
eng.close()

# a view made over the init memoryview and kept: finalize fails and says so
eng = ferry.Engine(BASE)
keep = []
eng.register("x", [8], 0, init=lambda n, mv: keep.append((ctypes.c_char * 4).from_buffer(mv)))
expect(eng.finalize, ferry.EINVAL, "outlives")
eng.close()
print("ok")
