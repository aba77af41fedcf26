#!/usr/bin/env python3
"""bench/peers/torch_llama.py — the PyTorch peer of ferry-gpt's Llama model:
the same model, weights, data, batch, sequence and steps trained by
transformers' LlamaForCausalLM on the same GPU, so that ferry-gpt's tokens/s,
model TFLOPS and losses can be held against it (tools/gpu_check.sh, part
scale). Also times torch's scaled_dot_product_attention alone (--sdpa-bench),
the peer of ferry's attention kernels.

  torch_llama.py --model PRESET|config.json --data FILE [--weights FILE|DIR]
                 [--batch B] [--seq S] [--steps N] [--device cuda|cpu] ...
  torch_llama.py --sdpa-bench --seq 2048 --head-dim 64|128 --heads H --batch B
                 (--head-dim 64,128 --heads 32,16: one line per pair, one start)

Training, as ferry-gpt trains (examples/gpt): the data file read as ferry-gpt
reads it (bytes of text, or .u16/.bin/.u32 token ids), the batches drawn by
its sampler (SplitMix64 seeded with seed ^ 0xDA7A5EED, one offset per window,
window i of step s the same tokens), the loss the mean cross-entropy over
the B x S next tokens in fp32, and AdamW with its defaults (lr 3e-4, betas
0.9/0.999, eps 1e-8, weight decay 0.1 on matrices; --decay all and
--clip-grad-norm 1.0 for ferry-gpt --engine with examples/configs/*.cfg).
On cuda: bf16 params, attn_implementation "sdpa", gradient checkpointing
(non-reentrant) and torch.optim.AdamW(fused=True). On cpu (its own test):
fp32 and the options given.

Output: one JSON line per step {"step", "loss", "tokens_per_s", "ms"}, then
{"final": true, "tokens_per_s" (median over the steps after the first),
"model_tflops" ((6 N tokens + attention flops) / time: N the parameters but
the input embedding, attention 6 L C S per token, causal), "peak_bytes"
(torch.cuda.max_memory_allocated), "losses", ...}. --sdpa-bench prints one
line {"fwd_ms", "fwd_bwd_ms", "peak_bytes", ...} (medians of --iters after
a warm-up, CUDA events). Exit 0; 1 a failure (said as {"error": ...}); 2 bad
usage.
"""
import argparse
import json
import os
import sys
import time

# ferry-gpt's presets (examples/gpt/config.c) and the Llama shapes the GPU
# check trains: vocab, hidden, intermediate, layers, heads, kv heads, positions.
PRESETS = {
    "llama-tiny": (256, 128, 344, 5, 4, 2, 256),
    "llama-small": (256, 384, 1024, 6, 6, 2, 256),
    "llama-1b": (32000, 2048, 5632, 22, 32, 4, 2048),  # TinyLlama-1.1B's shape
    "llama-2-7b": (32000, 4096, 11008, 32, 32, 32, 4096),
    "llama-2-13b": (32000, 5120, 13824, 40, 40, 40, 4096),
}
M64 = (1 << 64) - 1


def fail(msg, code=1):
    print(json.dumps({"error": msg}), flush=True)
    sys.exit(code)


def config_dict(model):
    """The config.json keys of a preset name, or a config.json file's."""
    if model in PRESETS:
        v, c, f, l, h, kv, pos = PRESETS[model]
        return {"model_type": "llama", "vocab_size": v, "hidden_size": c,
                "intermediate_size": f, "num_hidden_layers": l, "num_attention_heads": h,
                "num_key_value_heads": kv, "max_position_embeddings": pos,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                "tie_word_embeddings": False}
    with open(model) as f:
        d = json.load(f)
    if d.get("model_type") != "llama":
        fail("%s: model_type %r: this peer is Llama only" % (model, d.get("model_type")), 2)
    return d


# ---- ferry-gpt's data and sampler (examples/gpt/data.c) --------------------------------


def load_tokens(path, vocab):
    """The file's tokens as ferry-gpt reads them (byte tokenizer for text)."""
    with open(path, "rb") as f:
        raw = f.read()
    w = 2 if path.endswith((".u16", ".bin")) else 4 if path.endswith(".u32") else 1
    if len(raw) % w:
        fail("%s: not a whole number of %d-byte tokens" % (path, w), 2)
    toks = list(raw) if w == 1 else [int.from_bytes(raw[i:i + w], "little")
                                     for i in range(0, len(raw), w)]
    if toks and max(toks) >= vocab:
        fail("%s: token %d is outside the vocabulary (%d)" % (path, max(toks), vocab), 2)
    return toks


class Sampler:
    """gpt_data_batch: SplitMix64 (gpt_rand) seeded with seed ^ 0xDA7A5EED,
    each window's offset rand % (n - seq)."""

    def __init__(self, tokens, seed):
        self.t, self.s = tokens, (seed ^ 0xDA7A5EED) & M64

    def rand(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def batch(self, b, seq):
        if seq + 1 > len(self.t):
            fail("the data holds %d tokens, fewer than --seq + 1" % len(self.t), 2)
        span = len(self.t) - seq
        x, y = [], []
        for _ in range(b):
            o = self.rand() % span
            x.append(self.t[o:o + seq])
            y.append(self.t[o + 1:o + seq + 1])
        return x, y


# ---- the model -------------------------------------------------------------------------


def build_model(torch, cfgd, a, dtype, dev):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "rope_theta", "hidden_act", "tie_word_embeddings")
    kw = {k: cfgd[k] for k in keys if k in cfgd}
    kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
    cfg = LlamaConfig(attention_bias=False, mlp_bias=False, use_cache=False,
                      attn_implementation=a.attn, **kw)
    cfg._attn_implementation = a.attn
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # params made in dtype; RoPE's inv_freq stays fp32
    try:
        if dev.type == "cuda" and hasattr(torch.device, "__enter__"):
            with dev:
                model = LlamaForCausalLM(cfg)
        else:
            model = LlamaForCausalLM(cfg).to(dev)
    finally:
        torch.set_default_dtype(old)
    if a.weights:
        load_weights(torch, model, a.weights, cfgd)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, transformers.__version__


def load_weights(torch, model, path, cfgd):
    """ferry-gpt's safetensors (--save: fp32, Hugging Face names) into the
    model's params, converted to their dtype; every param must be there."""
    from safetensors import safe_open
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    params = dict(model.named_parameters())
    tied = bool(cfgd.get("tie_word_embeddings"))
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        extra = names - set(params)
        missing = [n for n in params if n not in names and not (tied and n == "lm_head.weight")]
        if extra or missing:
            fail("%s: names differ from the model's: not in the model %s; missing %s" % (
                path, sorted(extra)[:5], missing[:5]))
        with torch.no_grad():
            for n in names:
                t = f.get_tensor(n)
                if tuple(t.shape) != tuple(params[n].shape):
                    fail("%s: %s has shape %s, the model %s" % (path, n, tuple(t.shape),
                                                               tuple(params[n].shape)))
                params[n].copy_(t)


def flops_per_token(model, cfgd, seq):
    """6 N (N: the params but the input embedding, which is a lookup) plus
    causal attention's 6 L C S (QK^T and PV, forward and backward)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    if cfgd.get("tie_word_embeddings"):
        n += model.get_input_embeddings().weight.numel()  # the head's GEMM uses it
    c = cfgd["num_attention_heads"] * (cfgd["hidden_size"] // cfgd["num_attention_heads"])
    return 6 * n + 6 * cfgd["num_hidden_layers"] * c * seq, n


def make_optimizer(torch, model, a, dev):
    decay = [p for p in model.parameters() if a.decay == "all" or p.ndim >= 2]
    rest = [p for p in model.parameters() if not (a.decay == "all" or p.ndim >= 2)]
    groups = [{"params": decay, "weight_decay": a.weight_decay}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    kw = {"fused": True} if dev.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, **kw), bool(kw)


def lm_loss(torch, model, x, y, dev):
    """The mean next-token cross entropy of tokens x against targets y, in
    fp32 over bf16 logits (each peer's forward and loss)."""
    xt = torch.tensor(x, dtype=torch.long, device=dev)
    yt = torch.tensor(y, dtype=torch.long, device=dev)
    logits = model(input_ids=xt, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                             yt.view(-1))
    del logits
    return loss


def train(a):
    import torch
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch %s sees no GPU" % torch.__version__)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    if a.attn == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        fail("torch %s has no scaled_dot_product_attention: pass --attn eager" % torch.__version__, 2)
    cfgd = config_dict(a.model)
    seq = a.seq
    if seq > cfgd["max_position_embeddings"]:
        fail("--seq %d is over the model's %d positions" % (seq, cfgd["max_position_embeddings"]), 2)
    sampler = Sampler(load_tokens(a.data, cfgd["vocab_size"]), a.seed)
    t_setup = time.time()
    model, tf_version = build_model(torch, cfgd, a, dtype, dev)
    opt, fused = make_optimizer(torch, model, a, dev)
    fpt, n_params = flops_per_token(model, cfgd, seq)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats()
    setup_s = time.time() - t_setup
    losses, times = [], []
    for step in range(1, a.steps + 1):
        x, y = sampler.batch(a.batch, seq)
        sync()
        t0 = time.perf_counter()
        loss = lm_loss(torch, model, x, y, dev)
        loss.backward()
        if a.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss.item())
        sync()
        dt = time.perf_counter() - t0
        losses.append(lv)
        times.append(dt)
        print(json.dumps({"step": step, "loss": lv, "tokens_per_s": a.batch * seq / dt,
                          "ms": dt * 1e3}), flush=True)
    timed = sorted(times[1:] or times)
    med = timed[len(timed) // 2] if timed else None
    tokens = a.batch * seq
    fin = {"final": True, "steps": a.steps, "batch": a.batch, "seq": seq,
           "tokens_per_s": tokens / med if med else None,
           "model_tflops": fpt * tokens / med / 1e12 if med else None,
           "flops_per_token": fpt, "n_params": n_params, "median_step_ms": med * 1e3 if med else None,
           "losses": losses, "setup_s": setup_s, "device": a.device, "dtype": a.dtype,
           "attn": model.config._attn_implementation, "checkpointing": a.checkpointing,
           "fused_adamw": fused, "decay": a.decay, "clip_grad_norm": a.clip_grad_norm,
           "weights": a.weights or "transformers' random init", "torch": torch.__version__,
           "transformers": tf_version}
    if dev.type == "cuda":
        fin["peak_bytes"] = torch.cuda.max_memory_allocated()
        fin["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        fin["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(fin), flush=True)
    return 0


# ---- --sdpa-bench: torch's fused attention alone -----------------------------------------


def sdpa_bench(a):
    """One line per (head dim, heads) pair of the lists."""
    import copy
    dims = [int(x) for x in a.head_dim.split(",")]
    heads = [int(x) for x in a.heads.split(",")]
    if len(heads) == 1:
        heads *= len(dims)
    if len(heads) != len(dims) or min(dims + heads) < 1:
        fail("--head-dim and --heads: positive numbers, lists of the same length", 2)
    for hd, h in zip(dims, heads):
        b = copy.copy(a)
        b.head_dim, b.heads = hd, h
        sdpa_one(b)
    return 0


def sdpa_one(a):
    import torch
    F = torch.nn.functional
    if not hasattr(F, "scaled_dot_product_attention"):
        fail("torch %s has no scaled_dot_product_attention" % torch.__version__)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch %s sees no GPU" % torch.__version__)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    kv = min(a.kv_heads or a.heads, a.heads)
    if a.heads % kv:
        fail("--heads %d is not a multiple of --kv-heads %d" % (a.heads, kv), 2)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    shape = lambda h: (a.batch, h, a.seq, a.head_dim)
    q = torch.randn(shape(a.heads), device=dev, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(shape(kv), device=dev, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(shape(kv), device=dev, dtype=dtype, generator=g).requires_grad_()
    dout = torch.randn(shape(a.heads), device=dev, dtype=dtype, generator=g)
    gqa = "none"
    if kv != a.heads:
        try:
            F.scaled_dot_product_attention(q[:, :, :16], k[:, :, :16], v[:, :, :16],
                                           is_causal=True, enable_gqa=True)
            gqa = "enable_gqa"
        except TypeError:
            gqa = "expanded"  # older torch: k and v repeated per query head

    def attn():
        if gqa == "expanded":
            r = a.heads // kv
            return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1),
                                                  v.repeat_interleave(r, 1), is_causal=True)
        if gqa == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd():
        with torch.no_grad():
            attn()

    def fwd_bwd():
        o = attn()
        q.grad = k.grad = v.grad = None
        o.backward(dout)

    base = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    res = {"bench": "sdpa", "batch": a.batch, "seq": a.seq, "heads": a.heads, "kv_heads": kv,
           "head_dim": a.head_dim, "dtype": a.dtype, "causal": True, "gqa": gqa,
           "iters": a.iters, "device": a.device, "torch": torch.__version__}
    res["fwd_ms"] = median_ms(torch, dev, fwd, a.iters)
    res["fwd_bwd_ms"] = median_ms(torch, dev, fwd_bwd, a.iters)
    res["bwd_ms"] = res["fwd_bwd_ms"] - res["fwd_ms"]
    # causal: half the T x T scores; QK^T and PV forward, twice that backward
    fl = 4.0 * a.batch * a.heads * a.seq * a.seq * a.head_dim / 2
    res["fwd_tflops"] = fl / res["fwd_ms"] / 1e9
    res["fwd_bwd_tflops"] = 3.5 * fl / res["fwd_bwd_ms"] / 1e9  # backward: 2.5 x (dS recompute)
    if dev.type == "cuda":
        res["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        res["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(res), flush=True)
    del q, k, v, dout


def median_ms(torch, dev, fn, iters):
    """Median ms of iters calls after 3 untimed ones: CUDA events on cuda."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def add_run_args(ap):
    """The arguments of a training run, the same for this peer and DeepSpeed's
    (deepspeed/run_ds.py): model, weights, data, batch, seq, steps, lr, weight
    decay and what it decays, grad clipping, seed, attention, checkpointing."""
    ap.add_argument("--model", help="a preset (%s) or a Llama config.json" % ", ".join(PRESETS))
    ap.add_argument("--weights", help="safetensors file, or a folder holding model.safetensors "
                    "(ferry-gpt train --steps 0 --save DIR); default: transformers' init")
    ap.add_argument("--data", help="the training data, as ferry-gpt's --data")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    ap.add_argument("--lr", type=float, default=3e-4, help="AdamW lr (default 3e-4)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="default 0.1")
    ap.add_argument("--decay", choices=("matrices", "all"), default="matrices",
                    help="params with weight decay: matrices (ferry-gpt without --engine, the "
                         "default) or all (the engine's optimizer)")
    ap.add_argument("--clip-grad-norm", type=float, default=0.0,
                    help="clip the global grad norm (0: off, the default; the engine's "
                         "configs use 1.0)")
    ap.add_argument("--seed", type=int, default=1, help="the sampler's seed (default 1)")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                    help="transformers' attention implementation (default sdpa)")
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false",
                    help="without gradient checkpointing (default: on)")


def main(argv):
    ap = argparse.ArgumentParser(prog="torch_llama.py", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap)
    ap.add_argument("--device", default=None, help="cuda (default when torch sees a GPU) or cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                    help="param dtype (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads")
    ap.add_argument("--sdpa-bench", action="store_true", help="time SDPA alone (below)")
    ap.add_argument("--head-dim", default="64", help="--sdpa-bench: head dim(s), e.g. 64,128")
    ap.add_argument("--heads", default="32", help="--sdpa-bench: query heads, one per head dim")
    ap.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    ap.add_argument("--iters", type=int, default=20, help="--sdpa-bench's timed runs")
    a = ap.parse_args(argv)
    if min(a.batch, a.seq, a.iters) < 1 or a.steps < 0:
        ap.error("--batch, --seq, --steps and --iters must be positive")
    if a.device is None:
        try:
            import torch
            a.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            fail("cannot import torch")
    if a.dtype is None:
        a.dtype = "bf16" if a.device.startswith("cuda") else "fp32"
    if a.sdpa_bench:
        return sdpa_bench(a)
    if not a.model or not a.data:
        ap.error("training needs --model and --data")
    return train(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
