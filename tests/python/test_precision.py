"""python.precision: bf16 params (the model computes in bf16) and fp16 params
(dynamic loss scaling; on the host backend the model computes in fp32 over
fp16 buffers) train and the loss falls; torch.utils.checkpoint on the blocks
(reentrant, and both kinds with a tight device budget) gives the same losses
as without (fp32, bit for bit): its recompute runs the blocks' forward hooks
again during backward."""
import torch

from common import batches, check_budget, config, fail, ferry_losses, make_model

import ferry.torch as ft

data = batches(12)
for prec in ("bf16", "fp16"):
    eng = ft.initialize(make_model(), config(**{"precision.params": prec}))
    if eng.dtype != {"bf16": torch.bfloat16, "fp16": torch.float16}[prec]:
        fail("%s: params are %s" % (prec, eng.dtype))
    scale = eng.loss_scale()
    losses = ferry_losses(eng, data)
    check_budget(eng)
    print(prec, "loss scale %g" % scale, ["%.4f" % x for x in losses])
    if prec == "fp16" and not scale > 1:
        fail("fp16: loss scale %g" % scale)
    if not (sum(losses[-3:]) / 3 < losses[0] - 0.3):
        fail("%s: the loss does not fall" % prec)
    eng.close(restore=False)

plain = ft.initialize(make_model(), config())
a = ferry_losses(plain, data[:6])
ck = ft.initialize(make_model(ckpt=True), config())
b = ferry_losses(ck, data[:6])
print("plain:     ", [repr(x) for x in a])
print("checkpoint:", [repr(x) for x in b])
if a != b:
    fail("activation checkpointing changes the losses")
for kind in (True, "nonreentrant"):
    tight = ft.initialize(make_model(ckpt=kind), config(**{"tiers.gpu.budget": "96K",
                                                           "chunk_size": "16K"}))
    c = ferry_losses(tight, data[:6])
    print("checkpoint (%s), tight budget:" % ("reentrant" if kind is True else kind),
          [repr(x) for x in c])
    if c != a:
        fail("activation checkpointing with a tight device budget changes the losses")
    check_budget(tight)
print("ok")
