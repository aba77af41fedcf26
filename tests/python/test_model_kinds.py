"""python.model_kinds: a model with no nn.ModuleList (one group), a 0-dim
parameter (registered as [1]) and a frozen submodule: 5 steps match
torch.optim.AdamW (1e-5 relative), the frozen weights stay torch's and
unchanged, and close() gives each trained param its values back as ordinary
torch storage (equal to torch's after the same steps); prefix groups work
and a param in no group is refused."""
import torch
from torch import nn

from common import BETAS, EPS, LR, TORCH_DEVICE, WD, close_rel, config, fail

import ferry.torch as ft


class S(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.5))
        self.lin = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.frozen(self.lin(x)) * self.a))


def make():
    torch.manual_seed(3)
    return S().to(TORCH_DEVICE)


g = torch.Generator().manual_seed(5)
data = [(torch.randn(16, 8, generator=g).to(TORCH_DEVICE),
         torch.randn(16, 1, generator=g).to(TORCH_DEVICE)) for _ in range(5)]

ref = make()
opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=LR, betas=BETAS,
                        eps=EPS, weight_decay=WD)
want = []
for x, y in data:
    loss = (ref(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    want.append(loss.item())

for groups in (None, ["lin", "out", ""]):
    m = make()
    frozen_before = m.frozen.weight.detach().clone()
    eng = ft.initialize(m, config(), groups=groups)
    got = []
    for x, y in data:
        loss = (eng(x) - y).pow(2).mean()
        eng.backward(loss)
        eng.step()
        got.append(loss.item())
    print(groups, eng.groups, ["%.6f" % v for v in got], "torch", ["%.6f" % v for v in want])
    if not close_rel(want, got, 1e-5):
        fail("losses differ from torch's")
    eng.close()
    if not torch.equal(m.frozen.weight, frozen_before):
        fail("the frozen weights changed")
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        if p.shape != q.shape or not torch.allclose(p, q, rtol=1e-4, atol=1e-6):
            fail("%s after close(): %s, torch %s" % (n, p.flatten()[:3], q.flatten()[:3]))

try:
    ft.initialize(make(), config(), groups=["lin", "out"])
    fail("a param in no group was accepted")
except ValueError as e:
    print("raised:", e)
    if not str(e).endswith(": a"):
        fail("the message does not name the param")
print("ok")
