#!/usr/bin/env python3
"""tests/gpt/nan_weights.py IN OUT TENSOR: copies the safetensors file IN to
OUT with the first element of TENSOR (F32) set to NaN (issue 25 item 5's
damaged weights)."""
import json
import struct
import sys

src, dst, name = sys.argv[1:4]
raw = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
t = head[name]
assert t["dtype"] == "F32", t
at = 8 + n + t["data_offsets"][0]
raw[at:at + 4] = struct.pack("<f", float("nan"))
open(dst, "wb").write(raw)
