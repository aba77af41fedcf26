"""python.checkpoint: train 4 steps, save_checkpoint with a client state,
train 4 more; a fresh model (other initial values) and engine load the
checkpoint and train the same 4 steps: the losses are identical bit for bit
and the client state comes back."""
import shutil

from common import batches, check_budget, config, fail, ferry_losses, make_model, work_dir

import ferry.torch as ft

data = batches(8)
ckdir = work_dir("ckpt")
eng = ft.initialize(make_model(seed=0), config())
first = ferry_losses(eng, data[:4])
eng.save_checkpoint(ckdir, client_state={"step": 4, "note": "resume here"})
cont = ferry_losses(eng, data[4:])
check_budget(eng)
eng.close(restore=False)

eng2 = ft.initialize(make_model(seed=123), config())
state = eng2.load_checkpoint(ckdir)
if state != {"step": 4, "note": "resume here"}:
    fail("client state %r" % (state,))
resumed = ferry_losses(eng2, data[4:])
print("continued:", [repr(x) for x in cont])
print("resumed:  ", [repr(x) for x in resumed])
if resumed != cont:
    fail("the resumed losses differ")
if first[0] == resumed[0]:
    fail("suspicious: the first losses equal")
eng2.close(restore=False)
shutil.rmtree(ckdir, ignore_errors=True)
print("ok")
