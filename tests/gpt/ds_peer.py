#!/usr/bin/env python3
"""tests/gpt/ds_peer.py — bench/peers/deepspeed/, the DeepSpeed peer, where
no GPU is: prepare.sh parses (sh -n; it needs the network, so it is not run),
run_ds.py compiles and answers --help, its three committed DeepSpeed configs
hold the placements the README names and take the run's values, and
run_ds.py without CUDA prints one {"skip": true, "reason": ...} line and
exits 77, which this test passes on as its own skip. Where a GPU is and
the wheels are there, the run trains 2 steps and its final line is checked.
run_ds.py runs under the python FERRY_PEER_PYTHON names (default python3).

  ds_peer.py --dir bench/peers/deepspeed --data FILE
"""
import argparse
import json
import os
import subprocess
import sys
import types


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=100)
    return r.returncode, r.stdout


def check_configs(d):
    """Each placement's stage and offload devices; ds_config fills the run's values."""
    sys.path.insert(0, d)
    import run_ds
    want = {"offload": (2, "cpu", None), "zero3_cpu": (3, "cpu", "cpu"),
            "infinity": (3, "nvme", "nvme")}
    assert sorted(run_ds.PLACEMENTS) == sorted(want)
    for p, (stage, opt, par) in want.items():
        a = types.SimpleNamespace(ds_config=None, placement=p, batch=3, clip_grad_norm=1.0,
                                  lr=1e-3, weight_decay=0.05, nvme_path="/x/nvme")
        cfg = run_ds.ds_config(a, 131072000)
        z = cfg["zero_optimization"]
        got = (z["stage"], z.get("offload_optimizer", {}).get("device"),
               z.get("offload_param", {}).get("device"))
        assert got == (stage, opt, par), (p, got)
        assert cfg["bf16"]["enabled"] and cfg["optimizer"]["type"] == "AdamW", p
        assert cfg["train_micro_batch_size_per_gpu"] == 3 and cfg["gradient_clipping"] == 1.0
        assert cfg["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                              "weight_decay": 0.05}, p
        for key in ("offload_optimizer", "offload_param"):
            if z.get(key, {}).get("device") == "nvme":
                assert z[key]["nvme_path"] == "/x/nvme", p
        if par == "nvme":
            assert z["offload_param"]["buffer_size"] >= 131072000, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    prep, runner = os.path.join(a.dir, "prepare.sh"), os.path.join(a.dir, "run_ds.py")
    rc, out = run(["sh", "-n", prep])
    assert rc == 0, out
    rc, out = run([sys.executable, "-m", "py_compile", runner])
    assert rc == 0, out
    rc, out = run([sys.executable, runner, "--help"])
    assert rc == 0 and "--placement" in out and "zero3_cpu" in out, out
    check_configs(a.dir)
    py = os.environ.get("FERRY_PEER_PYTHON", "python3")
    rc, out = run([py, runner, "--model", "llama-tiny", "--data", a.data, "--steps", "2",
                   "--batch", "1", "--seq", "32"])
    objs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    if rc == 77:
        assert len(objs) == 1 and objs[0].get("skip") is True and objs[0]["reason"], out
        print("gpt.ds_peer: configs and scripts checked; run_ds.py skips: %s" % objs[0]["reason"])
        return 77
    assert rc == 0, out
    fin = objs[-1]
    assert fin.get("final") and len(fin["losses"]) == 2, out
    for k in ("tokens_per_s", "model_tflops", "peak_bytes", "peak_device_used_bytes",
              "peak_rss_bytes", "deepspeed"):
        assert fin.get(k), (k, fin)
    print("gpt.ds_peer: trained 2 steps on %s: %s" % (fin["gpu"], fin["losses"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
