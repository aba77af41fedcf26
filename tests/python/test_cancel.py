"""python.cancel: Engine.set_cancel (ferry_engine_set_cancel): a yes stops
finalize with FERRY_ECANCELED, an exception in the check counts as a yes and
is named, set_cancel after finalize is refused. ferry.torch.initialize: a
SIGINT that arrives while the engine's finalize runs (sent at its third
ask; 48 params of 1 MiB, every home on the host) stops it at a next ask
and raises KeyboardInterrupt well before the set-up would have ended
(without the cancel, Python's handler runs only once finalize returns),
Python's SIGINT handler back; a set-up without a signal is unchanged."""
import os
import signal
import time

from checks import expect
from common import config, fail

import torch
from torch import nn

import ferry
import ferry.torch as ft


def small_engine():
    e = ferry.Engine(config())
    for g in range(3):
        e.register("w%d" % g, (64, 64), g, init=lambda name, v: None)
    return e


e = small_engine()
e.set_cancel(lambda: True)
expect(e.finalize, ferry.ECANCELED, "cancelled")
e.close()


def broken():
    raise ValueError("the check broke")


e = small_engine()
e.set_cancel(broken)
expect(e.finalize, ferry.ECANCELED, "ValueError", "the check broke")
e.close()
e = small_engine()
e.set_cancel(lambda: False)
e.finalize()
expect(lambda: e.set_cancel(lambda: True), ferry.EINVAL, "before")
e.close()


class Big(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Linear(512, 512, bias=False) for _ in range(48))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def big_config():
    # every home on the host: finalize asks before each of the 48 params to its end
    return config(**{"chunk_size": "4M", "tiers.gpu.budget": "64M", "tiers.host.budget": "512M",
                     "placement.optimizer": "host"})


t0 = time.time()
eng = ft.initialize(Big(), big_config())
full = time.time() - t0
eng.close()
print("set-up without a signal: %.2f s" % full)
if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    fail("initialize left another SIGINT handler in place")

set_cancel = ferry.Engine.set_cancel


def interrupted_setup():
    """initialize with a SIGINT sent at the engine's third ask (mid-finalize,
    from whichever thread asks): (seconds from the signal to the
    KeyboardInterrupt, its message, asks after the signal)."""
    sent, asks = [], []

    def set_cancel_signalling(self, fn):
        def ask():
            asks.append(1)
            if len(asks) == 3:
                sent.append(time.time())
                os.kill(os.getpid(), signal.SIGINT)
            return fn()
        return set_cancel(self, ask)

    ferry.Engine.set_cancel = set_cancel_signalling
    try:
        ft.initialize(Big(), big_config())
        fail("initialize returned after a SIGINT during its set-up" if sent else
             "initialize installed no cancel check")
    except KeyboardInterrupt as exc:
        ended, msg = time.time(), str(exc)
    finally:
        ferry.Engine.set_cancel = set_cancel
    if not sent:
        fail("KeyboardInterrupt before any signal")
    print("KeyboardInterrupt %.2f s after the signal (%d asks in all): %s"
          % (ended - sent[0], len(asks), msg))
    return ended - sent[0], msg


after, msg = interrupted_setup()
if "cancelled by the caller" not in msg:
    fail("finalize ran to its end after the SIGINT")
if after > full / 2:
    fail("KeyboardInterrupt came %.2f s after the signal; the whole set-up takes %.2f s"
         % (after, full))
if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    fail("initialize left its SIGINT handler in place")
eng = ft.initialize(Big(), big_config())  # and the next set-up is as before
eng.close()
print("ok")
