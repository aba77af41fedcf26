#!/usr/bin/env python3
"""examples/recipes/make_tiny_hf.py — makes a tiny Hugging Face model folder
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json) of
GPT-2's or TinyLlama's shape, with plain Python: no torch, no transformers.

    python3 examples/recipes/make_tiny_hf.py --family gpt2 tiny-gpt2
    python3 examples/recipes/make_tiny_hf.py --family llama tiny-llama

The weights are seeded random values (matrices N(0, 0.02), norms 1, biases
0) in F32 under Hugging Face's names; the tokenizer is one of the small
fixtures of tests/fixtures/tokenizers (GPT-2's byte-level BPE; for llama the
SentencePiece-style BPE with byte fallback that TinyLlama and Llama-2 use).
The recipes of examples/recipes/ run on these folders in seconds, and the
tests run the recipes on them.
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizers")

# The shapes: a few layers, hidden 64; the vocabularies hold the fixture
# tokenizers' ids (703 for gpt2, 901 for sp_legacy).
FAMILIES = {
    "gpt2": {
        "fixture": "gpt2",
        "config": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                   "vocab_size": 704, "n_embd": 64, "n_layer": 2, "n_head": 4,
                   "n_positions": 128, "n_ctx": 128, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5, "bos_token_id": 0, "eos_token_id": 0,
                   "tie_word_embeddings": True, "torch_dtype": "float32"},
        "tokens": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"},
    },
    "llama": {
        "fixture": "sp_legacy",
        "config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "vocab_size": 904, "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 176, "max_position_embeddings": 128,
                   "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "attention_bias": False, "tie_word_embeddings": False,
                   "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"},
        "tokens": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    },
}


def tensors(cfg):
    """(name, shape, kind) of every tensor, kind 'w' (random), 'one', 'zero' or
    'mask' (lower triangle of ones)."""
    out = []
    if cfg["model_type"] == "gpt2":
        C, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
        out += [("wte.weight", (V, C), "w"), ("wpe.weight", (P, C), "w")]
        for i in range(L):  # Conv1D weights are [in, out]
            h = "h.%d." % i
            # attn.bias: the causal mask, a buffer GPT-2's own file carries too
            out += [(h + "attn.bias", (1, 1, P, P), "mask"),
                    (h + "ln_1.weight", (C,), "one"), (h + "ln_1.bias", (C,), "zero"),
                    (h + "attn.c_attn.weight", (C, 3 * C), "w"),
                    (h + "attn.c_attn.bias", (3 * C,), "zero"),
                    (h + "attn.c_proj.weight", (C, C), "w"), (h + "attn.c_proj.bias", (C,), "zero"),
                    (h + "ln_2.weight", (C,), "one"), (h + "ln_2.bias", (C,), "zero"),
                    (h + "mlp.c_fc.weight", (C, 4 * C), "w"), (h + "mlp.c_fc.bias", (4 * C,), "zero"),
                    (h + "mlp.c_proj.weight", (4 * C, C), "w"),
                    (h + "mlp.c_proj.bias", (C,), "zero")]
        out += [("ln_f.weight", (C,), "one"), ("ln_f.bias", (C,), "zero")]
        return out
    C, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], \
        cfg["num_hidden_layers"]
    hd = C // cfg["num_attention_heads"]
    KV = cfg["num_key_value_heads"] * hd
    out.append(("model.embed_tokens.weight", (V, C), "w"))
    for i in range(L):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (C,), "one"),
                (p + "self_attn.q_proj.weight", (C, C), "w"),
                (p + "self_attn.k_proj.weight", (KV, C), "w"),
                (p + "self_attn.v_proj.weight", (KV, C), "w"),
                (p + "self_attn.o_proj.weight", (C, C), "w"),
                (p + "post_attention_layernorm.weight", (C,), "one"),
                (p + "mlp.gate_proj.weight", (F, C), "w"), (p + "mlp.up_proj.weight", (F, C), "w"),
                (p + "mlp.down_proj.weight", (C, F), "w")]
    out.append(("model.norm.weight", (C,), "one"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), "w"))
    return out


def write_safetensors(path, cfg, seed):
    """One F32 safetensors file: an 8-byte little-endian header size, the
    JSON header (padded with spaces to 8 bytes), then the tensors' bytes."""
    rng = random.Random(seed)
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, kind in tensors(cfg):
        n = 1
        for s in shape:
            n *= s
        if kind == "w":
            vals = array("f", (rng.gauss(0.0, 0.02) for _ in range(n)))
        elif kind == "mask":
            side = shape[-1]
            vals = array("f", (float(k % side <= k // side) for k in range(n)))
        else:
            vals = array("f", [1.0 if kind == "one" else 0.0]) * n
        if sys.byteorder == "big":
            vals.byteswap()
        b = vals.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def make(family, out, seed=0):
    fam = FAMILIES[family]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(fam["config"], f, indent=2)
    write_safetensors(os.path.join(out, "model.safetensors"), fam["config"], seed)
    shutil.copyfile(os.path.join(FIXTURES, fam["fixture"], "tokenizer.json"),
                    os.path.join(out, "tokenizer.json"))
    tc = dict(fam["tokens"], tokenizer_class="PreTrainedTokenizerFast",
              model_max_length=fam["config"].get("n_positions")
              or fam["config"]["max_position_embeddings"])
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True,
                    help="gpt2 (GPT-2's shape) or llama (TinyLlama's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    ap.add_argument("out", help="the folder to write (made when missing)")
    a = ap.parse_args()
    make(a.family, a.out, a.seed)
    n = sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out))
    print("%s: a tiny %s folder (%s), %.1f KiB" % (a.out, a.family,
                                                  ", ".join(sorted(os.listdir(a.out))), n / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
