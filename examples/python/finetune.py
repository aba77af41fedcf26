#!/usr/bin/env python3
"""examples/python/finetune.py: trains a small GPT written in torch (or Hugging
Face transformers' GPT2LMHeadModel with --hf, when transformers is installed)
through ferry.torch: params, grads and AdamW state placed by the engine's
config, one group per transformer block. Byte-level tokens from a text file.

    PYTHONPATH=python FERRY_LIB=build/lib/libferry.so \\
        python3 examples/python/finetune.py --steps 50
    ... --compare-torch      # also torch.optim.AdamW all in RAM; prints the step-time ratio

Progress: one line per --log-every steps. --init loads a torch state_dict to
fine-tune; --save/--resume use ferry checkpoints with the data position and
RNG state as the client state.
"""
import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Fine-tune a small GPT through ferry.torch (DeepSpeed-like API over the "
                    "ferry offload engine).")
    ap.add_argument("--steps", type=int, default=50, help="optimizer steps (default 50)")
    ap.add_argument("--config", help="a ferry .cfg file applied over the example's defaults")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one engine config key (docs/CONFIG.md), repeatable")
    ap.add_argument("--data", help="text file to train on (byte tokens; default: the repo's "
                    "README.md and docs)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                    help="precision.params (default fp32)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads and optimizer.threads (default 1)")
    ap.add_argument("--budget", help="tiers.gpu.budget (default: room for every group)")
    ap.add_argument("--optimizer-home", choices=("host", "nvme"), default="host",
                    help="placement.optimizer (nvme needs --swap)")
    ap.add_argument("--swap", help="swap directory for the nvme tier")
    ap.add_argument("--checkpointing", action="store_true",
                    help="torch.utils.checkpoint on each block")
    ap.add_argument("--hf", action="store_true",
                    help="transformers' GPT2LMHeadModel (random init) instead of the built-in GPT")
    ap.add_argument("--init", help="a torch state_dict (.pt) to start from")
    ap.add_argument("--save", help="checkpoint directory, written at the end (and every "
                    "--save-every steps)")
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--resume", help="a checkpoint (folder or directory of them) to resume")
    ap.add_argument("--timeline", help="write the engine's Chrome trace JSON here at the end")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-torch", action="store_true",
                    help="also train the same model with torch.optim.AdamW all in RAM, a "
                    "step of each in turn, and print the median step times and their ratio")
    ap.add_argument("--warmup", type=int, default=3,
                    help="steps left out of the timing medians (default 3)")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.dim % a.heads or a.threads < 1:
        ap.error("--steps >= 1, --dim a multiple of --heads and --threads >= 1 are needed")
    if a.compare_torch and a.steps <= a.warmup:
        ap.error("--compare-torch needs --steps above --warmup")
    for kv in a.set:
        if "=" not in kv:
            ap.error("--set %r: expected KEY=VALUE" % kv)
    return a


def build_model(a, torch, nn):
    if a.hf:
        try:
            import transformers
        except ImportError:
            sys.exit("finetune: --hf needs transformers (pip install transformers)")
        cfg = transformers.GPT2Config(vocab_size=256, n_positions=a.seq, n_embd=a.dim,
                                      n_layer=a.layers, n_head=a.heads)
        hf = transformers.GPT2LMHeadModel(cfg)

        class Wrap(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = hf

            def forward(self, idx):
                return self.m(idx).logits
        return Wrap()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(a.dim)
            self.qkv = nn.Linear(a.dim, 3 * a.dim)
            self.proj = nn.Linear(a.dim, a.dim)
            self.ln2 = nn.LayerNorm(a.dim)
            self.fc = nn.Linear(a.dim, 4 * a.dim)
            self.out = nn.Linear(4 * a.dim, a.dim)
            self.register_buffer("mask", torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool),
                                                    1), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            h = a.heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(256, a.dim)
            self.wpe = nn.Embedding(a.seq, a.dim)
            self.blocks = nn.ModuleList([Block() for _ in range(a.layers)])
            self.ln_f = nn.LayerNorm(a.dim)
            self.head = nn.Linear(a.dim, 256, bias=False)
            self.head.weight = self.wte.weight  # tied, as GPT-2
            for n, p in self.named_parameters():
                if n.endswith("weight") and p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                if a.checkpointing and self.training:
                    x = torch.utils.checkpoint.checkpoint(b, x)
                else:
                    x = b(x)
            return self.head(self.ln_f(x))
    return GPT()


def load_text(a):
    paths = [a.data] if a.data else [os.path.join(HERE, "..", "..", "README.md"),
                                     os.path.join(HERE, "..", "..", "docs", "ARCHITECTURE.md")]
    data = b""
    for p in paths:
        with open(p, "rb") as f:
            data += f.read()
    if len(data) < a.seq + 2:
        sys.exit("finetune: %s: fewer than %d bytes" % (paths[0], a.seq + 2))
    return data


def engine_config(a, n_params):
    cfg = {"device": "host", "tiers.host.pinned": False, "placement.params": "host",
           "placement.optimizer": a.optimizer_home, "precision.params": a.precision,
           "optimizer.type": "adamw", "optimizer.lr": a.lr,
           "optimizer.weight_decay": a.weight_decay, "optimizer.threads": a.threads,
           "chunk_size": "1M",
           # room for every group twice over (params and the drain's grad buffers)
           "tiers.gpu.budget": a.budget or "%dM" % (3 * n_params * 4 // (1 << 20) + 16)}
    if a.swap:
        cfg["tiers.nvme.paths"] = [a.swap]
    return cfg


def main(argv):
    a = parse_args(argv)
    import torch
    import torch.utils.checkpoint  # noqa: F401
    from torch import nn

    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import ferry
    import ferry.torch as ft

    torch.set_num_threads(a.threads)
    text = load_text(a)
    tokens = torch.tensor(list(text), dtype=torch.long)
    g = torch.Generator().manual_seed(a.seed + 1)
    starts = torch.randint(0, len(tokens) - a.seq - 1, (a.steps, a.batch), generator=g)

    def batch(step):
        ix = starts[step]
        x = torch.stack([tokens[i:i + a.seq] for i in ix.tolist()])
        y = torch.stack([tokens[i + 1:i + 1 + a.seq] for i in ix.tolist()])
        return x, y

    def loss_of(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, 256).float(), y.reshape(-1))

    torch.manual_seed(a.seed)
    model = build_model(a, torch, nn)
    if a.init:
        model.load_state_dict(torch.load(a.init, map_location="cpu"))
    n_params = sum(p.numel() for p in model.parameters())
    cfg = ferry.Config(engine_config(a, n_params))
    if a.config:
        cfg.load_file(a.config)
    for kv in a.set:
        k, v = kv.split("=", 1)
        cfg.set(k.strip(), v.strip())
    ref = None
    if a.compare_torch:  # the same initial values for the torch run
        ref = build_model(a, torch, nn)
        ref.load_state_dict(model.state_dict())

    try:
        engine = ft.initialize(model, cfg)
    except ferry.Error as e:
        sys.exit("finetune: %s" % e)
    print("finetune: %s GPT, %.2fM params, %d groups, params %s, %d threads, device budget %s, "
          "optimizer on %s" % ("HF" if a.hf else "built-in", n_params / 1e6, len(engine.groups),
                               a.precision, a.threads, cfg.get("tiers.gpu.budget"),
                               cfg.get("placement.optimizer")))
    first = 0
    if a.resume:
        state = engine.load_checkpoint(a.resume) or {}
        first = state.get("step", 0)
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        print("finetune: resumed at step %d from %s" % (first, a.resume))

    times, losses = [], []
    rtimes, rlosses = [], []
    opt = None
    if ref is not None:  # stepped in lockstep with ferry, so both see the same machine load
        opt = torch.optim.AdamW(ref.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    engine.train()
    for step in range(first, a.steps):
        x, y = batch(step)
        t0 = time.perf_counter()
        loss = loss_of(engine(x), y)
        engine.backward(loss)
        info = engine.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if opt is not None:
            t0 = time.perf_counter()
            rloss = loss_of(ref(x), y)
            opt.zero_grad(set_to_none=True)
            rloss.backward()
            opt.step()
            rtimes.append(time.perf_counter() - t0)
            rlosses.append(rloss.item())
        if (step + 1) % a.log_every == 0 or step == first or step + 1 == a.steps:
            print("step %5d/%d  loss %.4f  %.1f ms/step  grad norm %.3f  scale %g%s"
                  % (step + 1, a.steps, losses[-1], 1e3 * times[-1], info["grad_norm"],
                     info["loss_scale"], "  (skipped)" if info["skipped"] else ""), flush=True)
        if a.save and a.save_every and (step + 1) % a.save_every == 0:
            engine.save_checkpoint(a.save, {"step": step + 1, "rng": torch.get_rng_state()})
    if a.save:
        engine.save_checkpoint(a.save, {"step": a.steps, "rng": torch.get_rng_state()})
        print("finetune: checkpoint in %s" % a.save)
    if a.timeline:
        engine.timeline(a.timeline)
    st = engine.stats()["tiers"]["device"]
    print("finetune: device tier peak %.1f MiB of %.1f MiB budget, %d evictions"
          % (st["peak"] / 2**20, st["budget"] / 2**20, st["evictions"]))

    if ref is not None:
        fm = statistics.median(times[a.warmup:])
        tm = statistics.median(rtimes[a.warmup:])
        print("compare: last loss ferry %.5f torch %.5f" % (losses[-1], rlosses[-1]))
        print("compare: median step (steps %d..%d, %d threads): ferry %.1f ms, torch AdamW "
              "in RAM %.1f ms, ratio %.3f" % (first + a.warmup + 1, a.steps, a.threads,
                                              1e3 * fm, 1e3 * tm, fm / tm))
    engine.close(restore=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
