"""python.errors: a bad config key, a bad value and a budget the engine
refuses raise ferry.Error carrying the status and the engine's own message
(which names the key); so does a .cfg file with a bad line."""
import os

from checks import expect
from common import config, fail, make_model, work_dir

import ferry
import ferry.torch as ft


expect(lambda: ft.initialize(make_model(), config(**{"tiers.gpu.budgte": "1M"})),
       ferry.ECONFIG, "tiers.gpu.budgte", "tiers.gpu.budget")
expect(lambda: ft.initialize(make_model(), config(**{"optimizer.betas": [0.9, 1.5]})),
       ferry.ECONFIG, "optimizer.betas")
expect(lambda: ft.initialize(make_model(), config(**{"precision.params": "fp8"})),
       ferry.ECONFIG, "precision.params", "fp8")
# finalize refuses a device budget that cannot hold the grad buffers
expect(lambda: ft.initialize(make_model(), config(**{"tiers.gpu.budget": "16K",
                                                      "chunk_size": "8K"})),
       ferry.ENOMEM, "device budget")
d = work_dir("cfg")
path = os.path.join(d, "bad.cfg")
with open(path, "w") as f:
    f.write('device = "host";\noptimizer = { lr = "fast"; };\n')
expect(lambda: ferry.Config(path), ferry.ECONFIG, "bad.cfg", "lr")
# loss.backward() instead of engine.backward(loss) is refused, not ignored
from common import batches, loss_of  # noqa: E402

eng = ft.initialize(make_model(), config())
x, y = batches(1)[0]
try:
    loss_of(eng(x), y).backward()
    fail("loss.backward() was accepted")
except RuntimeError as e:
    print("raised:", e)
    if "engine.backward" not in str(e):
        fail("the message does not say to call engine.backward")
print("ok")
