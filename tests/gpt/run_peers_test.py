#!/usr/bin/env python3
"""tests/gpt/run_peers_test.py — bench/peers/run_peers.py on the CPU with
llama-tiny (ctest gpt.run_peers): in each placement (offload, zero3_cpu,
infinity) ferry-gpt and ferry.torch train transformers' LlamaForCausalLM
and ferry-gpt's model from the same saved weights and batches for 3 steps;
every line is JSON, each final line holds the schema's figures, the losses
of ferry.torch equal ferry-gpt's within 1e-4 relative (both compute in fp32
over the same bf16 params; they differ by the order of sums, about 1e-6),
and the DeepSpeed peer, without CUDA, is one skip line with its reason.
ferry.torch and DeepSpeed run under FERRY_PEER_PYTHON (default python3);
where it cannot import torch, transformers and safetensors the ferry-gpt
side alone is checked and the test skips (77), saying so.

  run_peers_test.py --runner RUN_PEERS_PY --gpt FERRY_GPT --lib LIBFERRY --data FILE --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

TOL = 1e-4
PLACEMENTS = ("offload", "zero3_cpu", "infinity")
FINAL_KEYS = ("tokens_per_s", "model_tflops", "flops_per_token", "n_params", "median_step_ms",
              "peak_bytes", "peak_rss_bytes", "losses", "batch", "seq", "steps",
              "clip_grad_norm", "lr", "weight_decay")


def main():
    ap = argparse.ArgumentParser()
    for k in ("--runner", "--gpt", "--lib", "--data", "--work"):
        ap.add_argument(k, required=True)
    a = ap.parse_args()
    py = os.environ.get("FERRY_PEER_PYTHON", "python3")
    r = subprocess.run([py, "-c", "import torch, transformers, safetensors"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    why = None if r.returncode == 0 else "%s cannot import torch, transformers and " \
        "safetensors (set FERRY_PEER_PYTHON): %s" % (py, r.stdout.strip().splitlines()[-1:])
    peers = "ferry-gpt,deepspeed" if why else "ferry-gpt,ferry-torch,deepspeed"
    shutil.rmtree(a.work, ignore_errors=True)
    cmd = [sys.executable, a.runner, "--model", "llama-tiny", "--data", a.data, "--device",
           "cpu", "--batch", "2", "--seq", "64", "--steps", "3", "--threads", "1", "--gpt",
           a.gpt, "--python", py, "--lib", a.lib, "--work", a.work, "--peers", peers,
           "--timeout", "100"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=115)
    print(r.stdout)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]  # every line is JSON
    for p in PLACEMENTS:
        mine = [o for o in lines if o.get("placement") == p]
        fins = {o["peer"]: o for o in mine if o.get("final")}
        want = ["ferry-gpt"] + ([] if why else ["ferry-torch"])
        assert sorted(fins) == sorted(want), (p, sorted(fins))
        for peer, f in fins.items():
            for k in FINAL_KEYS:
                assert f.get(k) is not None, (p, peer, k, f)
            assert len(f["losses"]) == 3 and f["steps"] == 3 and f["seq"] == 64, f
            steps = [o for o in mine if o.get("peer") == peer and "step" in o
                     and not o.get("final")]
            assert [o["step"] for o in steps] == [1, 2, 3], steps
            assert [o["loss"] for o in steps] == f["losses"], (steps, f)
        assert fins["ferry-gpt"]["clip_grad_norm"] == (0.0 if p == "infinity" else 1.0)
        ds = [o for o in mine if o.get("peer") == "deepspeed"]
        assert len(ds) == 1 and ds[0].get("skip") is True and ds[0]["reason"], ds
        s = [o for o in mine if o.get("summary")]
        assert len(s) == 1, s
        if not why:
            d = s[0]["loss_max_rel_diff"]["ferry-torch"]
            print("%s: ferry.torch vs ferry-gpt losses, max relative difference %.3g (< %g)"
                  % (p, d, TOL))
            assert d < TOL, (p, fins["ferry-gpt"]["losses"], fins["ferry-torch"]["losses"])
    print("deepspeed: %s" % ds[0]["reason"])
    shutil.rmtree(a.work, ignore_errors=True)
    if why:
        print("gpt.run_peers: skip: the ferry-gpt side checked; ferry.torch not run: %s" % why)
        return 77
    print("gpt.run_peers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
