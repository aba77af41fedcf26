"""python.engine_api: ferry.Engine without torch: a linear least-squares model
y = x W (one param per group, 3 groups) trained through register, finalize,
fetch, param_device, grads_ready, release and step, with the grads computed
in Python over the device buffers (host backend); the loss falls, param_read
returns the master values the device buffers hold (fp32), stats and
timeline work, a call out of order raises ferry.Error with the engine's
message (FERRY_ESTATE), and init callbacks fill values at finalize (one that
raises fails finalize with its exception in the message)."""
import array
import ctypes
import json
import os
import random
import sys
import tempfile

if os.environ.get("FERRY_SANITIZE"):
    print("skip: a sanitizer build's libferry.so cannot be loaded into python")
    sys.exit(77)

import ferry  # noqa: E402


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


D, N, G = 4, 16, 3
rnd = random.Random(7)
xs = [[rnd.uniform(-1, 1) for _ in range(D)] for _ in range(N)]
target = [[0.3 * x[(j + 1) % D] - 0.2 * x[j] for j in range(D)] for x in xs]

eng = ferry.Engine({"device": "host", "tiers.gpu.budget": "64K", "tiers.host.budget": "16M",
                    "tiers.host.pinned": False, "chunk_size": "4K",
                    "placement.params": "host", "placement.optimizer": "host",
                    "precision.params": "fp32", "optimizer.lr": 0.05,
                    "optimizer.threads": 1})
for g in range(G):
    init = array.array("f", [0.1 * ((i * 7 + g) % 5 - 2) for i in range(D * D)])
    eng.register("w%d" % g, [D, D], g, init)
eng.finalize()
s = eng.stream()

try:
    eng.release(0, s)
    fail("release of a group not fetched was accepted")
except ferry.Error as e:
    print("raised:", e)
    if e.status != ferry.ESTATE or "not fetched" not in e.message:
        fail("unexpected error %r" % e)


def floats(ptr, n=D * D):
    return (ctypes.c_float * n).from_address(ptr)


def matmul(a, w):  # a: N x D lists, w: D*D row-major
    return [[sum(r[k] * w[k * D + j] for k in range(D)) for j in range(D)] for r in a]


losses = []
for step in range(30):
    acts = [xs]
    for g in range(G):
        eng.fetch(g, s)
        s.synchronize()
        w = floats(eng.param_device("w%d" % g)[0])
        acts.append(matmul(acts[-1], w))
        eng.release(g, s)
    out = acts[-1]
    loss = sum((out[i][j] - target[i][j]) ** 2 for i in range(N) for j in range(D)) / (N * D)
    losses.append(loss)
    d = [[2 * (out[i][j] - target[i][j]) / (N * D) for j in range(D)] for i in range(N)]
    for g in reversed(range(G)):
        eng.fetch(g, s)
        pw, pg = eng.param_device("w%d" % g, grad=True)
        s.synchronize()
        w, gw, a = floats(pw), floats(pg), acts[g]
        for k in range(D):
            for j in range(D):
                gw[k * D + j] = sum(a[i][k] * d[i][j] for i in range(N))
        d = [[sum(d[i][j] * w[k * D + j] for j in range(D)) for k in range(D)] for i in range(N)]
        eng.grads_ready(g, s)
        eng.release(g, s)
    info = eng.step()
print("losses", ["%.5f" % x for x in losses[::5]], "step", info["step"])
if info["step"] != 30 or not losses[-1] < 0.5 * losses[0]:
    fail("the loss does not fall")
eng.fetch(1, s)
s.synchronize()
dev = list(floats(eng.param_device("w1")[0]))
eng.release(1, s)
master = list(eng.param_read("w1", count=D * D))
if dev != master:
    fail("param_read %s, device buffer %s" % (master[:3], dev[:3]))
st = eng.stats()
if not 0 < st["tiers"]["device"]["peak"] <= st["tiers"]["device"]["budget"] or st["fetches"] < 180:
    fail("stats %r" % st["tiers"]["device"])
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "t.json")
    eng.write_timeline(path)
    with open(path) as f:
        json.load(f)
eng.close()

# an init callback fills the values at finalize; one that raises fails finalize
# with its exception in the message
cfg = {"device": "host", "tiers.gpu.budget": "64K", "tiers.host.pinned": False,
       "chunk_size": "4K", "precision.params": "fp32"}
e2 = ferry.Engine(cfg)


def halves(name, mv):
    for i in range(len(mv)):
        mv[i] = 0.5 * i


e2.register("h", [2, 3], 0, init=halves)
e2.finalize()
if list(e2.param_read("h", count=6)) != [0.5 * i for i in range(6)]:
    fail("init callback values")
e2.close()
e3 = ferry.Engine(cfg)


def broken(name, mv):
    raise ValueError("no values for " + name)


e3.register("b", [2], 0, init=broken)
try:
    e3.finalize()
    fail("a raising init callback was accepted")
except ferry.Error as e:
    print("raised:", e)
    if "no values for b" not in e.message:
        fail("the init callback's exception is not in the message")
e3.close()
print("ok")
