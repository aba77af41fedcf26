"""python.unused: params that get no gradient in some steps, as torch.optim
leaves them. A model whose forward uses one block and one of two experts
only on some steps (a whole group unused, and part of a group) trained 9
steps through ferry.torch against torch.optim.AdamW (zero_grad sets the
grads to None, so torch skips the unused params: no update, no weight
decay, their own step count unchanged): losses within 1e-5 relative and
every master within 1e-5 of torch's weights; with grad_accumulation = 2,
an expert used in one micro-batch of a step is stepped, one used in
neither is not; a checkpoint saved after a step that skipped params,
loaded into a fresh engine and trained on gives the uninterrupted run's
losses and weights bit for bit; optimizer.missing_grad = "zero" steps the
unused params with zero grads (DeepSpeed's behaviour), so there the
weights drift from torch's."""
import torch
from torch import nn

from common import (BETAS, EPS, LR, WD, DIM, Net, batches, close_rel, config, fail,
                    loss_of, work_dir)

import ferry.torch as ft


class Moe(Net):
    """Net with two experts after the blocks: block 2 runs on even steps
    only (its group is unused on odd ones), expert 1 on steps divisible by
    3 only (its params share the <after> group with the head)."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)])

    def forward(self, idx, k):
        x = self.emb(idx) + self.pos
        for j, b in enumerate(self.blocks):
            if j != 2 or k % 2 == 0:
                x = b(x)
        x = x + self.experts[0](x)
        if k % 3 == 0:
            x = x + self.experts[1](x)
        return self.head(self.ln_f(x))



def make():
    torch.manual_seed(0)
    return Moe()


data = batches(9)
STEPS = len(data)


def torch_run(accumulation=1, n=STEPS):
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    out = []
    for k in range(0, n, accumulation):
        opt.zero_grad(set_to_none=True)  # torch 2's default; unused params keep .grad None
        for m, (x, y) in enumerate(data[k:k + accumulation]):
            loss = loss_of(model(x, k + m), y)
            (loss / accumulation).backward()
            out.append(loss.item())
        opt.step()
    return out, {n: p.detach().clone() for n, p in model.named_parameters()}


def ferry_run(eng, steps, first=0):
    out = []
    for k in range(first, first + steps):
        x, y = data[k]
        loss = loss_of(eng(x, k), y)
        eng.backward(loss)
        eng.step()
        out.append(loss.item())
    return out


def weights(eng):
    return {n: eng.read_param(n) for n, _ in eng.named_parameters()}


def max_diff(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


ref, ref_w = torch_run()

# skip (the default): torch's losses and weights
eng = ft.initialize(make(), config())
got = ferry_run(eng, STEPS)
w = weights(eng)
eng.close()
print("torch:", ["%.6f" % v for v in ref])
print("ferry:", ["%.6f" % v for v in got])
d = max_diff(w, ref_w)
print("skip: largest weight difference from torch %.3g" % d)
if not close_rel(ref, got, 1e-5) or d > 1e-5:
    fail("skip: ferry.torch differs from torch with unused params (weights by %.3g)" % d)

# zero (DeepSpeed's): the unused params move, the weights drift from torch's
eng = ft.initialize(make(), config(**{"optimizer.missing_grad": "zero"}))
ferry_run(eng, STEPS)
dz = max_diff(weights(eng), ref_w)
eng.close()
print("zero: largest weight difference from torch %.3g" % dz)
if dz < 1e-4:
    fail("optimizer.missing_grad = zero: the unused params were not stepped (%.3g)" % dz)

# grad_accumulation = 2: a param with a grad in either micro-batch is stepped
ref2, ref2_w = torch_run(2, STEPS - 1)
eng = ft.initialize(make(), config(grad_accumulation=2))
got2 = ferry_run(eng, STEPS - 1)  # 4 steps of 2
w2 = weights(eng)
eng.close()
d2 = max_diff(w2, ref2_w)
print("accumulation 2: largest weight difference from torch %.3g" % d2)
if not close_rel(ref2, got2, 1e-5) or d2 > 1e-5:
    fail("grad_accumulation 2: differs from torch with unused params (weights by %.3g)" % d2)

# a checkpoint after a step that skipped params (step 4: block 2 and expert
# 1 unused; their own counts lag), resumed in a fresh engine: bit for bit
ckpt = work_dir("unused-ckpt")
eng = ft.initialize(make(), config())
first = ferry_run(eng, 4)
eng.save_checkpoint(ckpt)
eng.close()
eng = ft.initialize(make(), config())
eng.load_checkpoint(ckpt)
rest = ferry_run(eng, STEPS - 4, first=4)
wr = weights(eng)
eng.close()
if first + rest != got or any(not torch.equal(wr[n], w[n]) for n in w):
    fail("resume after a step with unused params differs from the uninterrupted run:\n"
         "%s\n%s" % (first + rest, got))
print("ok")
