#!/usr/bin/python3
"""tests/gpt/hf_folder.py — Hugging Face model folders in and out of ferry-gpt.

Makes a tiny HF-format folder per family (a tiny config.json, its weights
written by `ferry-gpt train --steps 0 --save`, a fixture tokenizer.json),
then `train --model IN --steps 2 --save OUT` and `sample --model OUT`: the
folder gives the config, the weights and the tokenizer (the same losses and
text as naming them with --weights / --tokenizer), and OUT holds
config.json, model.safetensors and tokenizer.json. `sample --json` prints
the prompt's ids: the fixture's ids with its post-processor's bos (those
Hugging Face tokenizers gave, cases.json's ids_special), as transformers'
tokenizer(prompt) before generate. A GPT-2 vocab.json + merges.txt pair
(--tokenizer DIR) is copied into the --save folder, which then loads as
--model DIR with the same ids. A tokenizer_config.json naming a Llama
tokenizer class sets bos / eos by add_bos_token / add_eos_token, as
transformers' LlamaTokenizerFast does over the file's post-processor.

--transformers: then loads each OUT with transformers (AutoModelForCausalLM,
AutoTokenizer) and checks its greedy continuation from the tokenizer's
default encode equals ferry-gpt's, and the pair's folder with GPT2Tokenizer
(the same ids as ferry-gpt tokenize); exit 77 when transformers cannot be
imported.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

FAMILIES = {
    "gpt2": ({"model_type": "gpt2", "vocab_size": 704, "n_embd": 32, "n_layer": 2,
              "n_head": 2, "n_positions": 64, "eos_token_id": 2}, "gpt2"),
    "llama": ({"model_type": "llama", "vocab_size": 704, "hidden_size": 32,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 64, "max_position_embeddings": 64,
               "tie_word_embeddings": False}, "llama3"),
}
PROMPT = "hello world"


def run(cmd, input=None):
    # an untrained model's text may hold broken UTF-8: replaced, as
    # tokenizers' decode does
    p = subprocess.run(cmd, capture_output=True, timeout=60,
                       input=input.encode() if input is not None else None)
    p.stdout, p.stderr = (x.decode("utf-8", "replace") for x in (p.stdout, p.stderr))
    if p.returncode:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def losses(out):
    return [ln.split()[3] for ln in out.splitlines() if ln.startswith("step ")]


def make_folder(a, fam, work):
    """A tiny HF folder: config.json, model.safetensors, tokenizer.json."""
    cfg, tok = FAMILIES[fam]
    d = os.path.join(work, fam + "_in")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(work, fam + ".json"), "w") as f:
        json.dump(cfg, f)
    run([a.gpt, "train", "--model", os.path.join(work, fam + ".json"), "--data", a.data,
         "--steps", "0", "--seq", "16", "--batch", "2", "--save", d])
    shutil.copy(os.path.join(a.fix, tok, "tokenizer.json"), d)
    return d


def ferry_text(a, model, *extra):
    out = run([a.gpt, "sample", "--model", model, "--prompt", PROMPT, "--tokens", "12",
               "--temperature", "0", *extra])
    assert out.startswith(PROMPT) and out.endswith("\n"), repr(out)
    return out[len(PROMPT):-1]


def fixture_case(a, tok):
    with open(os.path.join(a.fix, tok, "cases.json")) as f:
        return json.load(f)[0]  # "Hello world"


def check_prompt_ids(a, fam, out):
    """sample encodes its prompt as the tokenizer's encode does: with the
    post-processor's bos (llama3's <|begin_of_text|>), none for gpt2's."""
    case = fixture_case(a, FAMILIES[fam][1])
    got = json.loads(run([a.gpt, "sample", "--model", out, "--prompt", case["text"],
                          "--tokens", "3", "--temperature", "0", "--json"]))
    if got["prompt_ids"] != case["ids_special"]:
        sys.exit(f"FAIL {fam}: sample's prompt ids {got['prompt_ids']}, Hugging Face "
                 f"tokenizers' {case['ids_special']} for {case['text']!r}")
    print(f"{fam}: sample's prompt ids {got['prompt_ids']} = tokenizers' encode")
    return got


def gpt2_pair(a, work):
    """A GPT-2 vocab.json + merges.txt folder from the gpt2 fixture's model."""
    with open(os.path.join(a.fix, "gpt2", "tokenizer.json")) as f:
        model = json.load(f)["model"]
    d = os.path.join(work, "gpt2_pair")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump(model["vocab"], f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for m in model["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    return d


def check_pair(a, work):
    """--tokenizer DIR with vocab.json + merges.txt: --save copies both (and a
    tokenizer_config.json naming GPT2Tokenizer); the folder samples as --model DIR."""
    pair = gpt2_pair(a, work)
    cfg = os.path.join(work, "gpt2.json")
    out = os.path.join(work, "gpt2_pair_out")
    shutil.rmtree(out, ignore_errors=True)
    run([a.gpt, "train", "--model", cfg, "--data", a.data, "--tokenizer", pair, "--steps", "1",
         "--seq", "16", "--batch", "2", "--save", out])
    for name in ("vocab.json", "merges.txt"):
        with open(os.path.join(pair, name), "rb") as f, open(os.path.join(out, name), "rb") as g:
            if f.read() != g.read():
                sys.exit(f"FAIL: --save {out}: {name} differs from the --tokenizer folder's")
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        cls = json.load(f).get("tokenizer_class")
    if cls != "GPT2Tokenizer":
        sys.exit(f"FAIL: --save {out}: tokenizer_config.json names {cls}")
    text = fixture_case(a, "gpt2")["text"]
    want = run([a.gpt, "tokenize", "--tokenizer", pair], input=text)
    got = json.loads(run([a.gpt, "sample", "--model", out, "--prompt", text, "--tokens", "3",
                          "--temperature", "0", "--json"]))
    if got["prompt_ids"] != json.loads(want):
        sys.exit(f"FAIL: sample --model {out}: prompt ids {got['prompt_ids']}, the pair's {want}")
    print(f"gpt2 pair: --save copies vocab.json and merges.txt; sample --model DIR ids "
          f"{got['prompt_ids']}")
    return out, text, got["prompt_ids"]


def check_tokenizer_config(a, work, transformers):
    """sp_legacy (post-processor: <s> first) beside a tokenizer_config.json of
    LlamaTokenizerFast with add_bos_token off and add_eos_token on: no bos,
    </s> last (the ids transformers gives, checked with --transformers)."""
    d = os.path.join(work, "llama_config")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(a.fix, "sp_legacy", "tokenizer.json"), d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False,
                   "add_eos_token": True, "eos_token": "</s>"}, f)
    case = fixture_case(a, "sp_legacy")
    want = case["ids"] + [2]
    for path in (d, os.path.join(d, "tokenizer.json")):
        got = json.loads(run([a.gpt, "tokenize", "--tokenizer", path], input=case["text"]))
        if got != want:
            sys.exit(f"FAIL: tokenize --tokenizer {path} with add_bos_token off, add_eos_token "
                     f"on: {got}, not {want}")
    if transformers:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(d)(case["text"]).input_ids
        if hf != want:
            sys.exit(f"FAIL: transformers encodes {case['text']!r} in {d} as {hf}, not {want}")
    os.unlink(os.path.join(d, "tokenizer_config.json"))
    os.mkfifo(os.path.join(d, "tokenizer_config.json"))  # read as the other files are
    p = subprocess.run([a.gpt, "tokenize", "--tokenizer", d], input=b"x", capture_output=True,
                       timeout=20)
    if p.returncode != 1 or b"a FIFO" not in p.stderr:
        sys.exit(f"FAIL: a FIFO tokenizer_config.json: exit {p.returncode}\n{p.stderr}")
    print(f"tokenizer_config.json add_bos_token off, add_eos_token on: {want}; a FIFO refused")


def check_family(a, fam, work):
    src = make_folder(a, fam, work)
    out = os.path.join(work, fam + "_out")
    shutil.rmtree(out, ignore_errors=True)
    train = ["train", "--data", a.data, "--steps", "2", "--seq", "16", "--batch", "2"]
    got = losses(run([a.gpt, *train, "--model", src, "--save", out]))
    want = losses(run([a.gpt, *train, "--model", os.path.join(src, "config.json"),
                       "--weights", src, "--tokenizer", os.path.join(src, "tokenizer.json")]))
    if len(got) != 2 or got != want:
        sys.exit(f"FAIL {fam}: --model DIR losses {got}, with --weights/--tokenizer {want}")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.isfile(os.path.join(out, name)):
            sys.exit(f"FAIL {fam}: --save {out} has no {name}: {sorted(os.listdir(out))}")
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    for k in ("architectures", "model_type", "torch_dtype"):
        if k not in cfg:
            sys.exit(f"FAIL {fam}: the saved config.json has no {k}")
    text = ferry_text(a, out)
    explicit = ferry_text(a, os.path.join(out, "config.json"), "--weights", out,
                          "--tokenizer", os.path.join(out, "tokenizer.json"))
    if text != explicit:
        sys.exit(f"FAIL {fam}: sample --model DIR gave {text!r}, with the options {explicit!r}")
    print(f"{fam}: --model DIR = --weights/--tokenizer (losses {got}); saved "
          f"{sorted(os.listdir(out))}; sample {text!r}")
    check_prompt_ids(a, fam, out)
    return out, text


def check_hostile(a, out, work):
    """--model DIR's files go through the readers' checks: a FIFO
    tokenizer.json or a linked model.safetensors is refused, not read."""
    d = os.path.join(work, "hostile")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(out, "config.json"), d)
    os.mkfifo(os.path.join(d, "tokenizer.json"))
    os.symlink(os.path.abspath(os.path.join(out, "model.safetensors")),
               os.path.join(d, "model.safetensors"))
    for cut, why in (("", "a FIFO"), ("tokenizer.json", "a symbolic link")):
        if cut:
            os.unlink(os.path.join(d, cut))
        p = subprocess.run([a.gpt, "sample", "--model", d, "--tokens", "2"],
                           capture_output=True, text=True, timeout=20)
        if p.returncode != 1 or why not in p.stderr:
            sys.exit(f"FAIL: sample --model {d} ({why}): exit {p.returncode}\n{p.stderr}")
    print("a FIFO tokenizer.json and a linked model.safetensors in --model DIR: refused")


def check_transformers(fam, out, text):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
        sys.exit(f"FAIL {fam}: transformers loads {out} with {info}")
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(PROMPT, return_tensors="pt").input_ids  # the default encode: bos, as generate gets
    # greedy by hand: generate() imports torch.distributed.fsdp, which
    # Debian's torch 1.13 cannot under Python 3.11
    eos, new = model.config.eos_token_id, []
    with torch.no_grad():
        for _ in range(12):
            nxt = int(model(ids).logits[0, -1].argmax())
            if nxt == eos:
                break
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    got = tok.decode(new, skip_special_tokens=True)
    if got != text:
        sys.exit(f"FAIL {fam}: transformers continues {got!r}, ferry-gpt {text!r}")
    print(f"{fam}: transformers loads {out} ({type(model).__name__}, "
          f"{type(tok).__name__}) and continues as ferry-gpt does")


def check_pair_transformers(out, text, ids):
    from transformers import GPT2Tokenizer
    got = GPT2Tokenizer.from_pretrained(out)(text).input_ids
    if got != ids:
        sys.exit(f"FAIL: GPT2Tokenizer of {out} encodes {text!r} as {got}, ferry-gpt {ids}")
    print(f"gpt2 pair: GPT2Tokenizer loads {out}, the same ids {got}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--fix", required=True, help="tests/fixtures/tokenizers")
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--transformers", action="store_true")
    a = ap.parse_args()
    if a.transformers:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except Exception as e:  # ImportError, or a torch transformers refuses
            print(f"SKIP: transformers cannot be imported: {e}")
            return 77
    os.makedirs(a.work, exist_ok=True)
    for fam in FAMILIES:
        out, text = check_family(a, fam, a.work)
        if a.transformers:
            check_transformers(fam, out, text)
    check_tokenizer_config(a, a.work, a.transformers)
    pair_out, text, ids = check_pair(a, a.work)
    if a.transformers:
        check_pair_transformers(pair_out, text, ids)
    if not a.transformers:
        check_hostile(a, out, a.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
