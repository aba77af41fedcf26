"""python.torch2: ferry.torch's torch-2 code path, where torch has
Tensor.register_post_accumulate_grad_hook (2.1 and later): each param's
grad is handed in from that hook (no AccumulateGrad node is kept), every
group is handed in during loss.backward as soon as its grads are final (none
is left for the end of engine.backward), and the losses equal bit for bit
those of the same run through the AccumulateGrad-node fallback (the path
torch 1.13 takes), with and without non-reentrant checkpointing, and torch
AdamW's within 1e-5. Where torch lacks the hook the test skips, saying so."""
import sys
import warnings

import torch

from common import SKIP, batches, close_rel, config, fail, ferry_losses, make_model, \
    torch_losses

import ferry.torch as ft

warnings.simplefilter("ignore")

if not ft._HAS_POST_ACC:
    print("skip: torch %s has no Tensor.register_post_accumulate_grad_hook (torch >= 2.1): "
          "ferry.torch hands grads in through the AccumulateGrad node's hook here, the path "
          "the other python tests cover" % torch.__version__)
    sys.exit(SKIP)


def run(post_acc, ckpt, data):
    """Losses, and per step the groups handed in before engine.backward's end."""
    ft._HAS_POST_ACC = post_acc
    try:
        eng = ft.initialize(make_model(ckpt=ckpt), config())
    finally:
        ft._HAS_POST_ACC = True
    if bool(eng._acc) == post_acc:
        fail("post_acc=%s: %d AccumulateGrad nodes kept" % (post_acc, len(eng._acc)))
    early = []
    finish = eng._finish_backward

    def counted():
        early.append(sum(eng._handed))
        finish()
    eng._finish_backward = counted
    losses = ferry_losses(eng, data)
    groups = len(eng.groups)
    eng.close()
    return losses, early, groups


data = batches(4)
ref = torch_losses(make_model(), data)
for ckpt in (False, "nonreentrant"):
    hook, early, groups = run(True, ckpt, data)
    node, early_node, _ = run(False, ckpt, data)
    print("checkpoint %s: post-accumulate hook %s\n  AccumulateGrad node %s\n  torch %s"
          % (ckpt, [repr(x) for x in hook], [repr(x) for x in node], [repr(x) for x in ref]))
    if hook != node:
        fail("the post-accumulate hook's losses differ from the AccumulateGrad node's")
    if early != [groups] * len(data):
        fail("groups handed in during loss.backward, per step: %s of %d" % (early, groups))
    if not close_rel(hook, ref, 1e-5):
        fail("ferry.torch's losses differ from torch AdamW's beyond 1e-5")
print("python.torch2: ok")
