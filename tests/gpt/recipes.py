#!/usr/bin/python3
"""tests/gpt/recipes.py — runs the recipes of examples/recipes/ end to end on
tiny Hugging Face folders (GPT-2's shape and TinyLlama's) that the recipes'
own make_tiny_hf.py writes, calling the recipe scripts themselves:

  --case c       examples/recipes/finetune.sh (ferry-gpt train --model DIR
                 --save OUT, then sample --model OUT)
  --case python  examples/recipes/finetune_hf.py (transformers + ferry.torch,
                 save_pretrained) under $FERRY_PEER_PYTHON (default
                 /usr/bin/python3); exit 77 when it cannot import torch and
                 transformers

gpt2 runs on the recipes' defaults; llama on the engine config that `ferry
plan --model DIR/config.json ... --write-config` writes, as the TinyLlama
recipe does (with --ferry; else examples/configs/offload-nvme.cfg).

Each run's loss falls (finetune.sh refuses a folder without safetensors
weights), the saved folder holds config.json, model.safetensors
and tokenizer.json, and ferry-gpt loads it back: its loss on the first batch
(--steps 1 --lr 0) is below the untrained folder's, and it samples.
"""
import argparse
import os
import shutil
import subprocess
import sys

FAMILIES = ("gpt2", "llama")
PROMPT = "The"
TRAIN = ["--steps", "10", "--seq", "32", "--batch", "4", "--lr", "3e-3"]


def run(cmd, env=None, cwd=None, timeout=90):
    p = subprocess.run(cmd, capture_output=True, env=env, cwd=cwd, timeout=timeout)
    out, err = (x.decode("utf-8", "replace") for x in (p.stdout, p.stderr))
    if p.returncode:
        sys.exit("FAIL: %s: exit %d\n%s\n%s" % (" ".join(cmd), p.returncode, out[-3000:],
                                               err[-3000:]))
    return out


def losses(out):
    return [float(ln.split()[3]) for ln in out.splitlines() if ln.startswith("step ")]


def first_loss(a, model):
    """ferry-gpt's loss of `model` on the first batch of the recipes' data."""
    out = run([a.gpt, "train", "--model", model, "--data", a.data, "--steps", "1", "--lr", "0",
               "--seq", "32", "--batch", "4", "--seed", "1"])
    got = losses(out)
    if len(got) != 1:
        sys.exit("FAIL: ferry-gpt train --model %s: no step line\n%s" % (model, out))
    return got[0]


def check(a, fam, src, out, text):
    got = losses(text)
    if len(got) != 10 or not got[-1] < got[0] - 0.3:
        sys.exit("FAIL %s: the loss does not fall: %s\n%s" % (fam, got, text))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.isfile(os.path.join(out, name)):
            sys.exit("FAIL %s: %s has no %s: %s" % (fam, out, name, sorted(os.listdir(out))))
    before, after = first_loss(a, src), first_loss(a, out)
    if not after < before - 0.3:
        sys.exit("FAIL %s: ferry-gpt reloads %s with loss %.4f on the first batch, the "
                 "untrained folder %.4f" % (fam, out, after, before))
    print("%s: loss %.4f -> %.4f; ferry-gpt --model %s: first batch %.4f (untrained %.4f)"
          % (fam, got[0], got[-1], out, after, before))


def engine_cfg(a, src):
    """The llama folder's engine config: ferry plan's, as the TinyLlama
    recipe makes it, or offload-nvme.cfg without the ferry CLI."""
    if not a.ferry:
        return os.path.join(a.root, "examples/configs/offload-nvme.cfg")
    cfg, swap = os.path.join(a.work, "llama.cfg"), os.path.join(a.work, "swap")
    os.makedirs(swap, exist_ok=True)
    run([a.ferry, "plan", "--model", os.path.join(src, "config.json"), "--device", "host",
         "--gpu-budget", "64M", "--batch", "4", "--seq", "32", "--nvme-path", swap,
         "--write-config", cfg])
    return cfg


def case_c(a, fam, src, out):
    env = dict(os.environ, FERRY_GPT=a.gpt, PROMPT=PROMPT, TOKENS="16")
    extra = ["--engine", engine_cfg(a, src)] if fam == "llama" else []
    text = run([os.path.join(a.root, "examples/recipes/finetune.sh"), src, a.data, out,
                *TRAIN, *extra], env=env, cwd=a.work)
    cmds = [ln for ln in text.splitlines() if ln.startswith("+ ")]
    if len(cmds) != 2 or " train --model " not in cmds[0] or " sample --model " not in cmds[1]:
        sys.exit("FAIL %s: the recipe printed the commands %s" % (fam, cmds))
    if not text.split(cmds[1] + "\n", 1)[1].startswith(PROMPT):
        sys.exit("FAIL %s: no sample after %r:\n%s" % (fam, cmds[1], text))
    check(a, fam, src, out, text)
    # a folder without safetensors is refused, not trained from a random init
    bare = os.path.join(a.work, fam + "_bare")
    os.makedirs(bare)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, name), bare)
    p = subprocess.run([os.path.join(a.root, "examples/recipes/finetune.sh"), bare, a.data,
                        bare + "_out"], capture_output=True, text=True, env=env, timeout=30)
    if p.returncode != 1 or "no model.safetensors" not in p.stderr:
        sys.exit("FAIL %s: a folder without weights: exit %d\n%s" % (fam, p.returncode,
                                                                   p.stderr))


def case_python(a, fam, src, out, py):
    env = dict(os.environ, FERRY_LIB=a.lib, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    text = run([py, os.path.join(a.root, "examples/recipes/finetune_hf.py"), "--model", src,
                "--data", a.data, "--save", out, *TRAIN, "--threads", "1", "--prompt", PROMPT,
                "--tokens", "16", *(["--config", engine_cfg(a, src)] if fam == "llama" else [])],
               env=env, cwd=a.work)
    tail = text.split("finetune_hf: saved ", 1)[-1].split("\n", 1)[-1]
    if "finetune_hf: saved " not in text or not tail.startswith(PROMPT):
        sys.exit("FAIL %s: no sample after the save:\n%s" % (fam, text))
    check(a, fam, src, out, text)
    run([a.gpt, "sample", "--model", out, "--prompt", PROMPT, "--tokens", "8",
         "--temperature", "0"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=("c", "python"), required=True)
    for k in ("--gpt", "--root", "--data", "--work"):
        ap.add_argument(k, required=True)
    ap.add_argument("--lib", help="libferry.so (the python case)")
    ap.add_argument("--ferry", help="the ferry CLI (ferry plan)")
    a = ap.parse_args()
    a.gpt, a.root, a.data = (os.path.abspath(x) for x in (a.gpt, a.root, a.data))
    a.lib, a.ferry = (x and os.path.abspath(x) for x in (a.lib, a.ferry))
    py = None
    if a.case == "python":
        py = os.environ.get("FERRY_PEER_PYTHON", "/usr/bin/python3")
        r = subprocess.run([py, "-c", "import torch, transformers"], capture_output=True,
                           text=True)
        if r.returncode:
            print("SKIP: %s cannot import torch and transformers (set FERRY_PEER_PYTHON): %s"
                  % (py, (r.stderr.strip().splitlines() or ["?"])[-1]))
            return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    for fam in FAMILIES:
        src, out = os.path.join(a.work, fam), os.path.join(a.work, fam + "_tuned")
        run([sys.executable, os.path.join(a.root, "examples/recipes/make_tiny_hf.py"),
             "--family", fam, src])
        if py:
            case_python(a, fam, src, out, py)
        else:
            case_c(a, fam, src, out)
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
