#!/usr/bin/env python3
"""examples/gpt/tools/gen_reference.py — the PyTorch reference for the
ferry-gpt model test (tests/gpt/test_reference.c). Run once, with Debian's
python3-torch (torch 1.13, /usr/bin/python3), from the repository root:

    /usr/bin/python3 examples/gpt/tools/gen_reference.py

For a tiny GPT-2 and a tiny Llama (2 layers, d=64, vocab 256, seq 16, batch 2)
it writes under tests/fixtures/gpt/<family>/:
  config.json          Hugging Face style config
  model.safetensors    the initial weights (Hugging Face names and layouts)
  reference.safetensors
      tokens, targets            I32 [B, T]   the batch of the gradient check
      logits                     F32 [B*T, V]
      loss                       F32 [1]
      grad.<name>                F32          d(loss)/d(param) for every param
      train.tokens, train.targets I32 [10, B, T]  the batch of each AdamW step
                                 (one batch repeated: the loss falls)
      train.losses               F32 [10]     loss before each step's update
  with __metadata__ lr, weight_decay (AdamW, decay on 2-D params only).

The models are written here in plain torch from the Hugging Face formulas
(no transformers). The safetensors files use the format's own layout
(8-byte length, JSON header padded to 8, data sorted by dtype then name, as
safetensors.save_file does), written by hand so that Debian's torch needs
nothing else installed.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

B, T, STEPS = 2, 16, 10
LR, WD = 3e-3, 0.1

GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
        "n_positions": 32, "n_inner": None, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new", "tie_word_embeddings": True}
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
         "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "tie_word_embeddings": False}

DT_ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
            "U32", "F32", "F64", "I64", "U64"]
DT = {torch.float32: ("F32", "<f4"), torch.int32: ("I32", "<i4")}


def save_safetensors(path, tensors, metadata=None):
    items = []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dt = DT[t.dtype][0]
        items.append((name, dt, list(t.shape), t.numpy().astype(DT[t.dtype][1]).tobytes()))
    items.sort(key=lambda x: (-DT_ORDER.index(x[1]), x[0]))
    header, at = {}, 0
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    for name, dt, shape, data in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, data in items:
            f.write(data)


def schema(cfg):
    """(name, shape) in the order the C schema uses."""
    out = []
    if cfg["model_type"] == "gpt2":
        C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
        Fd = cfg["n_inner"] or 4 * C
        out += [("wte.weight", (V, C)), ("wpe.weight", (P, C))]
        for l in range(cfg["n_layer"]):
            p = f"h.{l}."
            out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                    (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                    (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                    (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                    (p + "mlp.c_fc.weight", (C, Fd)), (p + "mlp.c_fc.bias", (Fd,)),
                    (p + "mlp.c_proj.weight", (Fd, C)), (p + "mlp.c_proj.bias", (C,))]
        out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    else:
        C, V, Fd = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        hd = C // cfg["num_attention_heads"]
        KV = cfg["num_key_value_heads"] * hd
        out += [("model.embed_tokens.weight", (V, C))]
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            out += [(p + "input_layernorm.weight", (C,)),
                    (p + "self_attn.q_proj.weight", (C, C)), (p + "self_attn.k_proj.weight", (KV, C)),
                    (p + "self_attn.v_proj.weight", (KV, C)), (p + "self_attn.o_proj.weight", (C, C)),
                    (p + "post_attention_layernorm.weight", (C,)),
                    (p + "mlp.gate_proj.weight", (Fd, C)), (p + "mlp.up_proj.weight", (Fd, C)),
                    (p + "mlp.down_proj.weight", (C, Fd))]
        out += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    return out


def init_weights(cfg, gen):
    W = {}
    for name, shape in schema(cfg):
        if len(shape) == 2:
            w = torch.randn(shape, generator=gen) * 0.1
        elif "norm" in name or "ln_" in name:
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen) if name.endswith("weight") \
                else 0.05 * torch.randn(shape, generator=gen)
        else:
            w = 0.05 * torch.randn(shape, generator=gen)
        W[name] = w.float().requires_grad_(True)
    return W


def attention(q, k, v):
    hd = q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    Tn = q.shape[-2]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


def gpt2_forward(W, cfg, idx):
    Bn, Tn = idx.shape
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = C // H
    x = W["wte.weight"][idx] + W["wpe.weight"][:Tn]
    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(Bn, Tn, H, hd).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        h = F.gelu(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte.weight"].t()


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama_forward(W, cfg, idx):
    Bn, Tn = idx.shape
    C, H, KVh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, hd = cfg["rms_norm_eps"], C // H
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.arange(Tn).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = W["model.embed_tokens.weight"][idx]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].t()).view(Bn, Tn, H, hd).transpose(1, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].t()).view(Bn, Tn, KVh, hd).transpose(1, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].t()).view(Bn, Tn, KVh, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KVh, dim=1)
        v = v.repeat_interleave(H // KVh, dim=1)
        y = attention(q, k, v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ W[p + "self_attn.o_proj.weight"].t()
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(h @ W[p + "mlp.gate_proj.weight"].t())
        u = h @ W[p + "mlp.up_proj.weight"].t()
        x = x + (g * u) @ W[p + "mlp.down_proj.weight"].t()
    x = rmsnorm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].t()


def make(family, cfg, fwd, seed, root):
    out = os.path.join(root, family)
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    W = init_weights(cfg, gen)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(out, "model.safetensors"), W, {"format": "pt"})

    data = torch.randint(0, V, (STEPS + 1, B, T + 1), generator=gen)
    # training repeats one batch, so the losses must fall: a test of the step
    data[2:] = data[1]
    tokens, targets = data[0, :, :T], data[0, :, 1:]
    logits = fwd(W, cfg, tokens)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    ref = {"tokens": tokens.int(), "targets": targets.int(),
           "logits": logits.detach().reshape(B * T, V), "loss": loss.detach().reshape(1)}
    for name, _ in schema(cfg):
        ref["grad." + name] = W[name].grad.detach().clone()

    decay = [W[n] for n, s in schema(cfg) if len(s) == 2]
    no_decay = [W[n] for n, s in schema(cfg) if len(s) != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    losses = []
    for s in range(STEPS):
        x, y = data[1 + s, :, :T], data[1 + s, :, 1:]
        opt.zero_grad(set_to_none=False)
        l = F.cross_entropy(fwd(W, cfg, x).reshape(-1, V), y.reshape(-1))
        l.backward()
        opt.step()
        losses.append(l.item())
    ref["train.tokens"] = data[1:, :, :T].int().contiguous()
    ref["train.targets"] = data[1:, :, 1:].int().contiguous()
    ref["train.losses"] = torch.tensor(losses, dtype=torch.float32)
    save_safetensors(os.path.join(out, "reference.safetensors"), ref,
                     {"lr": repr(LR), "weight_decay": repr(WD), "torch": torch.__version__})
    print(family, "loss", loss.item(), "train", [round(v, 4) for v in losses])


def main():
    torch.set_num_threads(1)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests",
                        "fixtures", "gpt")
    make("gpt2", GPT2, gpt2_forward, 1234, root)
    make("llama", LLAMA, llama_forward, 5678, root)


if __name__ == "__main__":
    main()
