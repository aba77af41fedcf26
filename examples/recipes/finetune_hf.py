#!/usr/bin/env python3
"""examples/recipes/finetune_hf.py — the Python recipe: fine-tunes a Hugging
Face model folder (GPT-2, Llama, TinyLlama; AutoModelForCausalLM loads it)
on a text file through ferry.torch, saves it with save_pretrained (a folder
transformers and `ferry-gpt --model DIR` load), and samples from it.

    python3 examples/recipes/finetune_hf.py --model gpt2 --data FILE --save tuned

The model is loaded in fp32 and handed to ferry.torch.initialize: its
parameters, gradients and AdamW states live where the engine config puts
them (default: params and optimizer in host memory, fp32; --config FILE is
read over it, e.g. one `ferry plan --write-config` wrote, then --lr and each
--set KEY=VALUE). Batches are --batch windows of --seq + 1 tokens of the text, drawn at
seeded offsets. Needs torch and transformers; ferry is found installed, else
in the python/ folder of this checkout.
"""
import argparse
import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--data", required=True, help="the text file to train on")
    ap.add_argument("--save", required=True, help="the folder to write (save_pretrained)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    ap.add_argument("--batch", type=int, default=4, help="windows per step (default 4)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per window (default 128)")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the batches and the sample")
    ap.add_argument("--config", help="a ferry engine config (.cfg), read over the default")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one engine config key (docs/CONFIG.md), repeatable")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--prompt", default="The", help="the sample's start (default 'The')")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to sample (default 64)")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.seq < 1:
        ap.error("--steps, --batch and --seq must be positive")
    for kv in a.set:
        if "=" not in kv:
            ap.error("--set %r: expected KEY=VALUE" % kv)
    return a


def import_ferry():
    try:
        import ferry.torch as ft
    except ImportError:  # not installed: this checkout's python/
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import ferry.torch as ft
    import ferry
    return ferry, ft


def engine_config(ferry, a, n_params):
    """The default: fp32 params and AdamW states in host memory, the device
    tier (host memory too on the host backend) sized for every group twice."""
    cfg = ferry.Config({"device": "host", "tiers.host.pinned": False,
                        "placement.params": "host", "placement.optimizer": "host",
                        "precision.params": "fp32", "optimizer.type": "adamw",
                        "optimizer.lr": a.lr, "optimizer.weight_decay": 0.0,
                        "clip_grad_norm": 1.0, "chunk_size": "4M",
                        "tiers.gpu.budget": "%dM" % (3 * n_params * 4 // (1 << 20) + 16)})
    if a.config:
        cfg.load_file(a.config)
        cfg.set("optimizer.lr", repr(a.lr))
    for kv in a.set:
        k, v = kv.split("=", 1)
        cfg.set(k.strip(), v.strip())
    return cfg


def sample(torch, model, tok, a, limit):
    """Top-k (40) sampling at temperature 0.8 with the KV cache, up to the
    model's positions; stops at eos."""
    ids = tok(a.prompt, return_tensors="pt").input_ids
    g = torch.Generator().manual_seed(a.seed)
    new, past, x = [], None, ids
    model.eval()
    with torch.no_grad():
        for _ in range(min(a.tokens, limit - ids.shape[1])):
            out = model(input_ids=x, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float() / 0.8
            top = torch.topk(logits, min(40, logits.shape[0]))
            nxt = int(top.indices[torch.multinomial(top.values.softmax(-1), 1, generator=g)])
            if nxt == model.config.eos_token_id:
                break
            new.append(nxt)
            x = torch.tensor([[nxt]])
    return tok.decode(ids[0].tolist() + new, skip_special_tokens=True)


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        sys.exit("finetune_hf: needs torch and transformers (pip install transformers): %s" % e)
    ferry, ft = import_ferry()
    if a.threads:
        torch.set_num_threads(a.threads)

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    model.config.use_cache = False  # training: no KV cache
    with open(a.data, encoding="utf-8", errors="replace") as f:
        ids = tok(f.read(), add_special_tokens=False, verbose=False).input_ids
    limit = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    if a.seq > limit:
        sys.exit("finetune_hf: --seq %d is above the model's %d positions" % (a.seq, limit))
    if len(ids) < a.seq + 2:
        sys.exit("finetune_hf: %s holds %d tokens, fewer than --seq + 2" % (a.data, len(ids)))
    data = torch.tensor(ids, dtype=torch.long)
    g = torch.Generator().manual_seed(a.seed)
    starts = torch.randint(0, len(ids) - a.seq - 1, (a.steps, a.batch), generator=g)

    n_params = sum(p.numel() for p in model.parameters())
    try:
        engine = ft.initialize(model, engine_config(ferry, a, n_params),
                               compute_dtype=torch.float32)
    except ferry.Error as e:
        sys.exit("finetune_hf: %s" % e)
    print("finetune_hf: %s, %.2fM params in %d groups, %d tokens of data, batch %d x seq %d, "
          "%d steps, lr %g" % (type(model).__name__, n_params / 1e6, len(engine.groups),
                               len(ids), a.batch, a.seq, a.steps, a.lr), flush=True)
    engine.train()
    first = last = None
    t_all = time.perf_counter()
    for step in range(a.steps):
        rows = starts[step].tolist()
        x = torch.stack([data[i:i + a.seq] for i in rows])
        y = torch.stack([data[i + 1:i + 1 + a.seq] for i in rows])
        t0 = time.perf_counter()
        logits = engine(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 y.reshape(-1))
        engine.backward(loss)
        engine.step()
        last = loss.item()
        first = last if first is None else first
        print("step %5d/%d  loss %.4f  %.0f ms" % (step + 1, a.steps, last,
                                                  1e3 * (time.perf_counter() - t0)), flush=True)
    print("done: %d steps in %.1f s, loss %.4f -> %.4f" % (a.steps, time.perf_counter() - t_all,
                                                          first, last))
    engine.close()  # the trained values back into the model as torch tensors
    model.config.use_cache = True
    model.save_pretrained(a.save)
    tok.save_pretrained(a.save)
    print("finetune_hf: saved %s (%s)" % (a.save, ", ".join(sorted(os.listdir(a.save)))))
    print(sample(torch, model, tok, a, limit))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
