"""python.misuse: ferry.torch used as a torch user might, against what torch
does, or a clear ferry.Error before anything changes:
- a second backward before step() (grad_accumulation = 1) is refused
  (FERRY_ESTATE), the weights stay, step() then works and training goes on
  as torch's;
- a param's dtype changed after initialize (model.double(), p.data = ...,
  and double-then-float, which makes torch drop the grad hooks) is refused,
  never trained with zero grads;
- an exception inside backward before any group was handed in rolls the
  pass back (the losses stay torch's); one after some groups were handed in
  makes backward refuse until zero_grad(), which starts the step again;
- model.state_dict() before close() gives the engine's values (frozen
  params included), the same as after close(); export_weights with frozen
  params is refused;
- initialize refuses a device budget that cannot hold the groups one
  forward holds at once, and accepts the next size up;
- a second thread calling the engine while one is inside gets FERRY_EBUSY;
- a param without a gradient in a step is left as it is (torch's
  behaviour, no warning); with optimizer.missing_grad = "zero" it is
  stepped with zeros, as DeepSpeed does, and that is said once (a
  RuntimeWarning naming it)."""
import threading

import torch

from checks import expect
from common import (batches, close_rel, config, fail, ferry_losses, loss_of, make_model,
                    torch_losses)

import ferry
import ferry.torch as ft


data = batches(6)
ref = torch_losses(make_model(), data)

# (a) a second backward before step()
eng = ft.initialize(make_model(), config())
got = []
for k, (x, y) in enumerate(data):
    loss = loss_of(eng(x), y)
    eng.backward(loss)
    if k == 2:
        before = eng.read_param("blocks.1.fc.weight")
        expect(lambda: eng.backward(loss_of(eng(x), y)), ferry.ESTATE, "step()")
        if not torch.equal(before, eng.read_param("blocks.1.fc.weight")):
            fail("the refused backward changed the weights")
    if eng.step() is None:
        fail("step() after the refused backward returned None")
    got.append(loss.item())
print("torch:", ["%.6f" % v for v in ref])
print("ferry:", ["%.6f" % v for v in got])
if not close_rel(ref, got, 1e-5):
    fail("the losses after a refused backward differ from torch's")
eng.close()

# dtype changes after initialize
x, y = data[0]
for label, change in (("model.double()", lambda m, e: m.double()),
                      ("p.data", lambda m, e: setattr(e._p[3], "data",
                                                      e._p[3].data.to(torch.float64)))):
    model = make_model()
    eng = ft.initialize(model, config())
    ferry_losses(eng, data[:1])
    change(model, eng)
    print(label)
    expect(lambda: eng(x), ferry.EINVAL, "float64", "initialize")
    eng.close(restore=False)
model = make_model()
eng = ft.initialize(model, config())
ferry_losses(eng, data[:1])
model.double()
model.float()  # back, but torch has dropped the hooks that hand the grads in
print("double then float")
expect(lambda: eng.backward(loss_of(eng(x), y)), ferry.EINVAL, "dtype", "blocks")
expect(lambda: eng.step(), ferry.ESTATE, "initialize again")
eng.close(restore=False)


# (b) exceptions inside backward
class Boom(torch.autograd.Function):
    armed = False

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        if Boom.armed:
            Boom.armed = False
            raise KeyboardInterrupt("Ctrl-C in backward")
        return g


# at the loss: nothing handed in yet, the pass rolls back
eng = ft.initialize(make_model(), config())
got = []
for k, (x, y) in enumerate(data):
    if k == 2:
        Boom.armed = True
        try:
            eng.backward(Boom.apply(loss_of(eng(x), y)))
            fail("no exception out of backward")
        except KeyboardInterrupt as e:
            print("interrupted:", e)
    loss = loss_of(eng(x), y)
    eng.backward(loss)
    eng.step()
    got.append(loss.item())
if not close_rel(ref, got, 1e-5):
    fail("the losses after an interrupted backward differ from torch's: %s" % got)

# between blocks: the groups after it were handed in; backward refuses until zero_grad()
model = make_model()
eng = ft.initialize(model, config())
hook = model.blocks[1].register_forward_hook(lambda m, i, o: Boom.apply(o))
ferry_losses(eng, data[:1])
x, y = data[1]
Boom.armed = True
try:
    eng.backward(loss_of(eng(x), y))
    fail("no exception out of backward")
except KeyboardInterrupt:
    pass
expect(lambda: eng.backward(loss_of(eng(x), y)), ferry.ESTATE, "zero_grad()", "stopped")
eng.zero_grad()
losses = ferry_losses(eng, data[1:4])
print("after zero_grad:", ["%.6f" % v for v in losses])
gn = eng.last_step["grad_norm"]
if not 0 < gn < float("inf"):
    fail("the step after zero_grad() has grad norm %r" % gn)
hook.remove()
eng.close()

# (d) state_dict before close, frozen params included
model = make_model()
model.ln_f.weight.requires_grad_(False)
with torch.no_grad():
    model.ln_f.weight.mul_(1.5)
eng = ft.initialize(model, config())
ferry_losses(eng, data[:2])
sd = {k: v.clone() for k, v in model.state_dict().items()}
empty = [k for k, v in sd.items() if v.numel() == 0]
if empty:
    fail("state_dict before close() has empty tensors: %s" % empty[:3])
if not torch.equal(sd["blocks.0.fc.weight"], eng.read_param("blocks.0.fc.weight")):
    fail("state_dict does not hold the engine's values")
if not torch.equal(sd["ln_f.weight"], torch.full_like(sd["ln_f.weight"], 1.5)):
    fail("the frozen param is not in state_dict with its value")
expect(lambda: eng.export_weights(config()["tiers.nvme.paths"][0] + "/w.safetensors"),
       ferry.EINVAL, "frozen", "ln_f.weight")
eng.close()
after = model.state_dict()
for k, v in sd.items():
    if not torch.equal(v, after[k]):
        fail("state_dict before close() differs from after it at %s" % k)

# (f) the device budget at initialize (groups <before> and one block at once)
over = {"tiers.gpu.budget": "72K", "chunk_size": "4K"}
expect(lambda: ft.initialize(make_model(), config(**over)), ferry.ENOMEM, "tiers.gpu.budget",
       "blocks.")
eng = ft.initialize(make_model(), config(**{"tiers.gpu.budget": "80K", "chunk_size": "4K"}))
ferry_losses(eng, data[:2])
eng.close()

# (i) a second thread while one is inside
model = make_model()
eng = ft.initialize(model, config())
inside, go, out = threading.Event(), threading.Event(), []


def wait_inside(m, i, o):
    if threading.current_thread().name == "first":
        inside.set()
        go.wait(30)


hook = model.blocks[0].register_forward_hook(wait_inside)
x, y = data[0]
t = threading.Thread(target=lambda: out.append(eng(x)), name="first")
t.start()
if not inside.wait(30):
    fail("the first thread did not reach the block")
expect(lambda: eng(x), ferry.EBUSY, "first", "one thread")
expect(lambda: eng.step(), ferry.EBUSY, "first")
go.set()
t.join()
hook.remove()
eng.backward(loss_of(out[0], y))  # the first thread's forward, its backward here
if eng.step() is None:
    fail("no step after the threads")
eng.close()
# a param without a gradient in a step: with optimizer.missing_grad = zero
# stepped with zeros (DeepSpeed's behaviour, not torch's), and said once
import warnings  # noqa: E402

model = make_model()
model.spare = torch.nn.Linear(4, 4)  # never used by forward
eng = ft.initialize(model, config(**{"optimizer.missing_grad": "zero"}))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    ferry_losses(eng, data[:2])
said = [str(w.message) for w in seen if "no gradient" in str(w.message)]
print("warnings:", said)
if len(said) != 1 or "spare.weight" not in said[0]:
    fail("an unused param was stepped without one warning naming it: %s" % said)
eng.close()
# the default (skip): left as it is, as torch does, with no warning
model = make_model()
model.spare = torch.nn.Linear(4, 4)
spare0 = model.spare.weight.detach().clone()
eng = ft.initialize(model, config())
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    ferry_losses(eng, data[:2])
said = [str(w.message) for w in seen if "no gradient" in str(w.message)]
if said or not torch.equal(eng.read_param("spare.weight"), spare0):
    fail("missing_grad = skip: the unused param moved, or a warning: %s" % said)
eng.close()
print("ok")
