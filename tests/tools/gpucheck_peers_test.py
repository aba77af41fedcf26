#!/usr/bin/env python3
"""tests/tools/gpucheck_peers_test.py — the GPU check's part peers without a
GPU (ctest tools.gpucheck_peers): tools/gpucheck_peers.py --host-smoke runs
the part's driver on the CPU with llama-tiny, every placement and peer
(ferry.torch under FERRY_PEER_PYTHON, a failed run where that python has no
transformers; DeepSpeed a skip without CUDA); each run is in peers.jsonl as
soon as it ends. Then the resume: a second smoke on the same folder runs
nothing that is done, and one whose peers.jsonl lost its last run reruns
that run alone.

  gpucheck_peers_test.py ROOT FERRY_GPT LIBFERRY SCRATCH
"""
import json
import os
import shutil
import subprocess
import sys


def smoke(root, gpt, lib, out):
    cmd = [sys.executable, os.path.join(root, "tools/gpucheck_peers.py"), "--host-smoke",
           "--gpt", gpt, "--lib", lib, "--root", root, "--out", out, "--budget", "100"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=110)
    print(r.stdout)
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), r.returncode


def main(root, gpt, lib, scratch):
    py = os.environ.get("FERRY_PEER_PYTHON", "python3")
    has_tf = subprocess.run([py, "-c", "import torch, transformers, safetensors"],
                            capture_output=True).returncode == 0
    shutil.rmtree(scratch, ignore_errors=True)
    d, rc = smoke(root, gpt, lib, scratch)
    runs = d["figures"]["runs"]
    assert len(runs) == 9 and d["figures"]["done_before"] == [], sorted(runs)
    for k, r in runs.items():
        model, placement, peer = k.split("/")
        want = {"ferry-gpt": "pass", "ferry-torch": "pass" if has_tf else "fail",
                "deepspeed": "skip"}[peer]
        assert r["status"] == want, (k, r)
        if want == "pass":
            assert len(r["final"]["losses"]) == 3 and r["final"]["tokens_per_s"] > 0, r
    assert (rc == 0) == has_tf and (d["status"] == "pass") == has_tf, (rc, d["reason"])
    assert len(d["summary"]) == 15, d["summary"]
    with open(os.path.join(scratch, "peers.jsonl")) as f:
        lines = f.read().splitlines()
    assert len(lines) == 9, lines
    done = 9 if has_tf else 6
    d2, _ = smoke(root, gpt, lib, scratch)  # the resume: only the failed runs again
    assert len(d2["figures"]["done_before"]) == done, d2["figures"]["done_before"]
    with open(os.path.join(scratch, "peers.jsonl")) as f:
        assert len(f.read().splitlines()) == 9 + (9 - done)
    with open(os.path.join(scratch, "peers.jsonl"), "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")  # the last run lost
    d3, _ = smoke(root, gpt, lib, scratch)
    assert len(d3["figures"]["done_before"]) == done - 1, d3["figures"]["done_before"]
    print("tools.gpucheck_peers: ok%s" % ("" if has_tf else " (ferry.torch not run: %s lacks "
                                          "transformers; set FERRY_PEER_PYTHON)" % py))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
