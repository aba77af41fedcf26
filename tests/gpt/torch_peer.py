#!/usr/bin/env python3
"""tests/gpt/torch_peer.py — bench/peers/torch_llama.py, the PyTorch peer of
ferry-gpt's Llama model, on the CPU in fp32: it loads the initial weights
ferry-gpt saves (train --steps 0 --save DIR), draws the same batches, and
its losses over 3 steps (forward, backward and AdamW) equal ferry-gpt's
within 1e-3 relative; its --help and final line hold what the GPU check
reads. It runs under the python FERRY_PEER_PYTHON names (default python3)
and skips (exit 77) where that python cannot import torch, transformers and
safetensors.

  torch_peer.py --gpt FERRY_GPT --peer TORCH_LLAMA_PY --data FILE --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, **kw)
    return r.returncode, r.stdout


def lines(text):
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    for k in ("--gpt", "--peer", "--data", "--work"):
        ap.add_argument(k, required=True)
    a = ap.parse_args()
    py = os.environ.get("FERRY_PEER_PYTHON", "python3")
    rc, out = run([py, "-c", "import torch, transformers, safetensors"])
    if rc != 0:
        print("gpt.torch_peer: skip: %s cannot import torch, transformers and safetensors "
              "(set FERRY_PEER_PYTHON): %s" % (py, out.strip().splitlines()[-1:]))
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    init = os.path.join(a.work, "init")
    common = ["--model", "llama-tiny", "--data", a.data, "--steps", "3", "--batch", "2",
              "--seq", "64"]
    rc, out = run([a.gpt, "train"] + common[:4] + ["--steps", "0", "--save", init])
    assert rc == 0 and os.path.isfile(os.path.join(init, "model.safetensors")), out
    rc, out = run([a.gpt, "train"] + common + ["--json", "--threads", "1"])
    assert rc == 0, out
    ferry = [o["loss"] for o in lines(out) if "step" in o and not o.get("final")]
    assert len(ferry) == 3, out
    rc, out = run([py, a.peer, "--model", os.path.join(init, "config.json"), "--weights", init,
                   "--device", "cpu", "--attn", "eager", "--threads", "1"] + common[2:])
    assert rc == 0, out
    objs = lines(out)
    steps = [o for o in objs if "step" in o and not o.get("final")]
    fin = objs[-1]
    assert [o["step"] for o in steps] == [1, 2, 3], out
    assert all(k in o for o in steps for k in ("loss", "tokens_per_s", "ms")), steps
    assert fin.get("final") and fin["dtype"] == "fp32" and fin["checkpointing"], fin
    for k in ("tokens_per_s", "model_tflops", "flops_per_token", "n_params", "losses"):
        assert fin.get(k) is not None, (k, fin)
    # llama-tiny: every param but the input embedding (256 x 128)
    assert fin["n_params"] == 940416, fin["n_params"]
    torch_l = [o["loss"] for o in steps]
    rel = max(abs(t - f) / abs(f) for t, f in zip(torch_l, ferry))
    print("ferry-gpt %s\ntorch     %s\nmax relative difference %.3g" % (ferry, torch_l, rel))
    assert rel < 1e-3, "the peer's losses differ from ferry-gpt's"
    rc, out = run([py, a.peer, "--help"])
    assert rc == 0 and "--sdpa-bench" in out and "--weights" in out, out
    rc, out = run([py, a.peer, "--model", "llama-tiny", "--data", a.data, "--device", "cpu",
                   "--seq", "4096", "--attn", "eager"])
    assert rc == 2 and "positions" in out, (rc, out)
    # --sdpa-bench where this torch has SDPA (2.0 and later)
    rc, out = run([py, a.peer, "--sdpa-bench", "--device", "cpu", "--dtype", "fp32", "--seq",
                   "128", "--head-dim", "64", "--heads", "4", "--kv-heads", "2", "--batch", "1",
                   "--iters", "2"])
    d = lines(out)[-1] if lines(out) else {}
    if "no scaled_dot_product_attention" in d.get("error", ""):
        print("(--sdpa-bench not run: %s)" % d["error"])
    else:
        assert rc == 0 and d["fwd_ms"] > 0 and d["fwd_bwd_ms"] > 0, out
    shutil.rmtree(a.work, ignore_errors=True)
    print("gpt.torch_peer: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
