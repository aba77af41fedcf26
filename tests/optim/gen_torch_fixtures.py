#!/usr/bin/env python3
"""tests/optim/gen_torch_fixtures.py — writes torch_fixtures.txt, the PyTorch
reference trajectories that tests/optim/test_torch.c compares ferry's CPU
optimizers against (torch.optim AdamW, Adam, Adagrad, SGD; a few hundred
steps). Params and gradients come from a hash both sides compute exactly, so
the fixture holds only torch's results. Run once with Debian's torch:

    /usr/bin/python3 tests/optim/gen_torch_fixtures.py > tests/optim/torch_fixtures.txt
"""
import sys

import torch

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hval(seed, step, i):
    """A value in [-1, 1) with 24 significant bits: exact in fp32."""
    h = splitmix64((seed * 1000003 + step) * 1000003 + i)
    return ((h >> 40) / 16777216.0) * 2.0 - 1.0


N = 64
STEPS = 300
CHECKS = (1, 50, STEPS)

# name, torch optimizer, ferry type, lr, beta1, beta2, eps, wd, momentum, dampening,
# nesterov, lr_decay, grad dtype given to ferry, loss scale given to ferry
CASES = [
    ("adamw", "AdamW", 0, 1e-2, 0.9, 0.999, 1e-8, 1e-2, 0, 0, 0, 0, "f32", 1.0),
    ("adam_l2", "Adam", 1, 1e-2, 0.9, 0.999, 1e-8, 1e-2, 0, 0, 0, 0, "f32", 1.0),
    ("adagrad", "Adagrad", 2, 5e-2, 0, 0, 1e-10, 1e-2, 0, 0, 0, 1e-3, "f32", 1.0),
    ("sgd_momentum", "SGD", 4, 1e-2, 0, 0, 0, 1e-3, 0.9, 0.1, 0, 0, "f32", 1.0),
    ("sgd_nesterov", "SGD", 4, 1e-2, 0, 0, 0, 0, 0.9, 0, 1, 0, "f32", 1.0),
    ("sgd_plain", "SGD", 4, 5e-2, 0, 0, 0, 0, 0, 0, 0, 0, "f32", 1.0),
    ("adamw_bf16_scaled", "AdamW", 0, 1e-3, 0.9, 0.95, 1e-6, 1e-1, 0, 0, 0, 0, "bf16", 1024.0),
]


def fmt(t):
    return " ".join("%.9g" % float(x) for x in t.tolist())


def main():
    torch.set_num_threads(1)
    out = sys.stdout
    out.write("# ferry optim fixtures from torch %s: see gen_torch_fixtures.py\n" % torch.__version__)
    for seed, c in enumerate(CASES, start=1):
        (name, cls, ftype, lr, b1, b2, eps, wd, mom, damp, nest, lrd, gdt, scale) = c
        p = torch.tensor([hval(seed, 0, i) for i in range(N)], dtype=torch.float32)
        p.requires_grad_(False)
        p = torch.nn.Parameter(p)
        if cls in ("AdamW", "Adam"):
            opt = getattr(torch.optim, cls)([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                                            foreach=False)
        elif cls == "Adagrad":
            opt = torch.optim.Adagrad([p], lr=lr, lr_decay=lrd, weight_decay=wd, eps=eps,
                                      foreach=False)
        else:
            opt = torch.optim.SGD([p], lr=lr, momentum=mom, dampening=damp, weight_decay=wd,
                                  nesterov=bool(nest), foreach=False)
        out.write("case %s %d %d %d %.9g %.9g %.9g %.9g %.9g %.9g %.9g %d %.9g %s %.9g\n" %
                  (name, ftype, N, STEPS, lr, b1, b2, eps, wd, mom, damp, nest, lrd, gdt, scale))
        for step in range(1, STEPS + 1):
            g = torch.tensor([hval(seed, step, i) for i in range(N)], dtype=torch.float32)
            if gdt == "bf16":
                g = g.bfloat16().float()
            p.grad = g
            opt.step()
            if step in CHECKS:
                out.write("p %d %s\n" % (step, fmt(p.detach())))
        st = opt.state[p]
        if cls in ("AdamW", "Adam"):
            out.write("s1 %s\n" % fmt(st["exp_avg"]))
            out.write("s2 %s\n" % fmt(st["exp_avg_sq"]))
        elif cls == "Adagrad":
            out.write("s1 %s\n" % fmt(st["sum"]))
        elif mom:
            out.write("s1 %s\n" % fmt(st["momentum_buffer"]))
        out.write("end\n")


if __name__ == "__main__":
    main()
