"""python.hooks_alloc: in the steady state (steps 3..10) the hooks make no
tensor (views over engine buffers and saved-tensor records are cached: the
engine's counters stay put), the number of live tensors does not grow, and
tracemalloc sees no growth of Python memory across the steps."""
import gc
import warnings
import tracemalloc

import torch

from common import batches, config, fail, ferry_losses, make_model

import ferry.torch as ft


warnings.simplefilter("ignore")


def live_tensors():
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


data = batches(10)
eng = ft.initialize(make_model(), config())
ferry_losses(eng, data[:2])  # warm-up: views and records made once
gc.collect()
counters = (eng.views_made, eng.records_made, eng.unpack_views)
tensors = live_tensors()
tracemalloc.start()
ferry_losses(eng, data[2:3])
gc.collect()
snap0 = tracemalloc.take_snapshot()
ferry_losses(eng, data[3:])
gc.collect()
snap1 = tracemalloc.take_snapshot()
tracemalloc.stop()
growth = sum(s.size_diff for s in snap1.compare_to(snap0, "filename")
             if s.size_diff > 0 and "ferry" in (s.traceback[0].filename if s.traceback else ""))
after = (eng.views_made, eng.records_made, eng.unpack_views)
print("hook tensors (views, records, unpacked views): warm %s, after 8 steps %s" % (counters, after))
print("live tensors %d -> %d; python memory growth in ferry's files over 7 steps: %d bytes"
      % (tensors, live_tensors(), growth))
if after != counters:
    fail("the hooks made tensors in the steady state")
if live_tensors() > tensors:
    fail("live tensors grew")
if growth > 0:
    for s in snap1.compare_to(snap0, "lineno")[:10]:
        print(s)
    fail("ferry's Python code allocated memory that it kept")
print("ok")
