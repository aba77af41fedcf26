#!/usr/bin/env python3
"""tests/gpt/st_edit.py IN OUT [--nan TENSOR] [--add NAME=FROM]...: copies
the safetensors file IN to OUT, with the first element of TENSOR (F32) set
to NaN (issue 25 item 5's damaged weights) and/or a tensor NAME added as a
copy of tensor FROM (item 6's extra tensors: lm_head.weight with a tied
head). Header keys are written sorted, data in header order."""
import argparse
import json
import struct

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("dst")
ap.add_argument("--nan")
ap.add_argument("--add", action="append", default=[])
a = ap.parse_args()
raw = open(a.src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = head.pop("__metadata__", None)
data = {k: bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        for k, v in head.items()}
if a.nan:
    assert head[a.nan]["dtype"] == "F32"
    data[a.nan][0:4] = struct.pack("<f", float("nan"))
for spec in a.add:
    name, src = spec.split("=")
    head[name] = dict(head[src])
    data[name] = bytearray(data[src])
out, at = {}, 0
for k in sorted(head):
    out[k] = {"dtype": head[k]["dtype"], "shape": head[k]["shape"],
              "data_offsets": [at, at + len(data[k])]}
    at += len(data[k])
if meta is not None:
    out["__metadata__"] = meta
hb = json.dumps(out, separators=(",", ":")).encode()
hb += b" " * (-len(hb) % 8)
with open(a.dst, "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb)
    for k in sorted(head):
        f.write(data[k])
