"""ferry: Python binding of the ferry offload engine (libferry.so, through ctypes).

Error carries a status and the engine's message; Config builds a configuration
from a dict of dotted keys or a .cfg file; Engine and Stream expose the C engine
API one call per method. ferry.torch drives an engine from a PyTorch model.

Every name, key and path reaches C as a NUL-terminated string: one holding a
NUL is refused (FERRY_EINVAL), never cut short; paths may be str, bytes or
os.PathLike. An engine is driven by one thread at a time: a call while another
thread is inside the same engine raises Error(FERRY_EBUSY).
"""
import ctypes
import functools
import os
import threading

from . import _lib
from ._lib import lib

__all__ = ["Error", "Config", "Engine", "Stream", "version", "status_name", "library_path",
           "checkpoint_find", "checkpoint_verify", "DTYPES"]

_STATUS = {0: "FERRY_OK", -1: "FERRY_EINVAL", -2: "FERRY_ENOMEM", -3: "FERRY_ENODEV",
           -4: "FERRY_EIO", -5: "FERRY_ENOSPC", -6: "FERRY_ECORRUPT", -7: "FERRY_EAGAIN",
           -8: "FERRY_ENOTSUP", -9: "FERRY_ECONFIG", -10: "FERRY_EBUSY", -11: "FERRY_ESTATE",
           -12: "FERRY_ENOENT", -13: "FERRY_EPERM", -14: "FERRY_EOVERFLOW",
           -15: "FERRY_ETIMEDOUT", -16: "FERRY_ECANCELED"}
for _v, _n in _STATUS.items():
    globals()[_n[6:]] = _v  # ferry.EINVAL, ferry.ENOMEM, ...

# precision.params names -> ferry_dtype values
DTYPES = {"fp32": 1, "fp16": 2, "bf16": 3}
TIER_DEVICE, TIER_HOST, TIER_NVME = 0, 1, 2
_TIER_NAMES = ("device", "host", "nvme")
_FAMILY_NAMES = ("params", "grads", "optim")


def status_name(status):
    """'FERRY_EINVAL' for -1, ..."""
    return _STATUS.get(status, "FERRY_E?(%d)" % status)


def version():
    return lib.ferry_version().decode()


def library_path():
    return _lib.path


def _s(b):
    return b.decode(errors="replace") if b else ""


class Error(Exception):
    """A ferry call failed: .status (negative FERRY_E... code), .message (the
    engine's message), .call (the C function)."""

    def __init__(self, status, message, call=""):
        self.status = status
        self.message = message
        self.call = call
        text = "%s (%s: %s)" % (message or _s(lib.ferry_strerror(status)), status_name(status),
                                _s(lib.ferry_strerror(status)))
        super().__init__("%s: %s" % (call, text) if call else text)


def _c(value, what, path=False):
    """value as the bytes of a C string: a str (UTF-8; a path: os.fsencode),
    bytes or (path) an os.PathLike. A NUL inside is refused: C would stop
    there and silently use the part before it."""
    if isinstance(value, (bytes, bytearray)):
        b = bytes(value)
    elif isinstance(value, str):
        b = os.fsencode(value) if path else value.encode()
    elif path and isinstance(value, os.PathLike):
        b = os.fsencode(value)
    else:
        raise TypeError("ferry: %s must be %s, not %s" % (
            what, "str, bytes or os.PathLike" if path else "str or bytes", type(value).__name__))
    if b"\0" in b:
        raise Error(EINVAL, "%s %r holds a NUL byte (C strings end there)" % (what, value))
    return b


def _one_thread(fn):
    """Engine methods: a call while another thread is inside the same engine
    raises Error(FERRY_EBUSY) instead of racing it (the engine's calls are
    not thread-safe); the same thread may call in again (an init callback)."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        lock = self.__dict__.get("_lock")
        if lock is None:
            return fn(self, *args, **kwargs)
        if not lock.acquire(blocking=False):
            raise Error(EBUSY, "thread %r is inside this engine; an engine is driven by one "
                        "thread at a time (use one engine per thread, or a lock around its "
                        "calls)" % (self._inside,), fn.__name__)
        outer = self._inside
        self._inside = threading.current_thread().name
        try:
            return fn(self, *args, **kwargs)
        finally:
            self._inside = outer
            lock.release()
    return call


def _check(rc, msg_fn, call):
    if rc != 0:
        raise Error(rc, msg_fn(), call)
    return rc


def _text(v):
    """A Python value in the text form ferry_config_set takes."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ", ".join(_text(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (bytes, os.PathLike)):
        return os.fsdecode(v)  # a path: its text, not "b'...'"
    return str(v)


class Config:
    """An engine configuration: Config({"tiers.gpu.budget": "64M", ...}), or
    Config("file.cfg"), or Config("file.cfg", {overrides}). Values may be str,
    int, float, bool or a list (written "a, b")."""

    def __init__(self, source=None, overrides=None):
        h = ctypes.c_void_p()
        _check(lib.ferry_config_create(ctypes.byref(h)), lambda: _s(lib.ferry_last_error()),
               "ferry_config_create")
        self._h = h
        if isinstance(source, Config):
            text = source.dump()
            self._call(lib.ferry_config_load_string(self._h, text.encode(), b"<config>"),
                       "ferry_config_load_string")
        elif isinstance(source, (str, bytes, os.PathLike)):
            self.load_file(source)
        elif source is not None:
            self.update(source)
        if overrides:
            self.update(overrides)

    def _call(self, rc, name):
        return _check(rc, lambda: _s(lib.ferry_config_last_error(self._h)), name)

    def load_file(self, path):
        self._call(lib.ferry_config_load_file(self._h, _c(path, "config path", True)),
                   "ferry_config_load_file")

    def load_string(self, text, name="<string>"):
        self._call(lib.ferry_config_load_string(self._h, _c(text, "config text"),
                                                _c(name, "config name")),
                   "ferry_config_load_string")

    def set(self, key, value):
        self._call(lib.ferry_config_set(self._h, _c(key, "config key"),
                                        _c(_text(value), "value of %s" % key)),
                   "ferry_config_set")

    def update(self, d):
        for k, v in dict(d).items():
            self.set(k, v)

    def get(self, key):
        """The key's value as text, whole (the buffer grows until it fits)."""
        k = _c(key, "config key")
        n = 4096
        while True:
            buf = ctypes.create_string_buffer(n)
            self._call(lib.ferry_config_get(self._h, k, buf, n), "ferry_config_get")
            v = buf.value
            if len(v) < n - 1:  # not cut at the buffer's end
                return v.decode()
            n *= 4

    def __getitem__(self, key):
        return self.get(key)

    def __setitem__(self, key, value):
        self.set(key, value)

    def write_file(self, path):
        self._call(lib.ferry_config_write_file(self._h, _c(path, "config path", True)),
                   "ferry_config_write_file")

    def dump(self):
        """The whole configuration as libconfig text."""
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "c.cfg")
            self.write_file(p)
            with open(p) as f:
                return f.read()

    @staticmethod
    def keys():
        """[(name, type, default, description)] of every key."""
        out = []
        for i in range(lib.ferry_config_key_count()):
            a = [ctypes.c_char_p() for _ in range(4)]
            lib.ferry_config_key_info(i, *[ctypes.byref(x) for x in a])
            out.append(tuple(_s(x.value) for x in a))
        return out

    def close(self):
        if getattr(self, "_h", None):
            lib.ferry_config_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()


def _release_views(views, arr):
    """Releases an init callback's views of the engine's buffer (newest
    first): a view kept past the callback would read freed memory later.
    A view made over one and kept (an array, a tensor, a ctypes object: it
    holds the buffer `arr` alive) is an error: the callback must copy."""
    import gc
    import sys
    for attempt in (0, 1):
        try:
            for v in reversed(views):
                v.release()
            if sys.getrefcount(arr) <= 3:  # arr's owners: the caller, this frame, the call
                return
        except BufferError:
            pass
        gc.collect()  # a view held only by a reference cycle
    raise BufferError("a view of the buffer (an array, tensor or ctypes object made over the "
                      "memoryview) outlives the callback; copy the values into the view "
                      "instead of keeping one")


def _stats_dict(st):
    tiers = {}
    for t, tn in enumerate(_TIER_NAMES):
        tiers[tn] = {
            "budget": st.budget[t], "current": st.tier_current[t], "peak": st.tier_peak[t],
            "evictions": st.evictions[t], "writebacks": st.writebacks[t],
            "families": {fn: {"current": st.current[t][f], "peak": st.peak[t][f]}
                         for f, fn in enumerate(_FAMILY_NAMES)}}
    d = {"tiers": tiers}
    for name, _ in _lib.Stats._fields_:
        v = getattr(st, name)
        if isinstance(v, (int, float)):
            d[name] = v
    d["nvme_read_bytes"] = {fn: st.nvme_read_bytes[f] for f, fn in enumerate(_FAMILY_NAMES)}
    d["nvme_write_bytes"] = {fn: st.nvme_write_bytes[f] for f, fn in enumerate(_FAMILY_NAMES)}
    return d


class Stream:
    """A ferry stream of an engine's device (ferry_stream_create), or a stream
    the caller owns adopted with ferry_stream_wrap (native: a cudaStream_t)."""

    def __init__(self, engine, native=None):
        self._engine = engine
        dev = lib.ferry_engine_device(engine._h)
        h = ctypes.c_void_p()
        if native is None:
            rc, call = lib.ferry_stream_create(dev, ctypes.byref(h)), "ferry_stream_create"
        else:
            rc, call = lib.ferry_stream_wrap(dev, ctypes.c_void_p(native), ctypes.byref(h)), \
                "ferry_stream_wrap"
        _check(rc, lambda: _s(lib.ferry_device_last_error(dev)), call)
        self._dev = dev
        self.handle = h.value

    def synchronize(self):
        _check(lib.ferry_stream_synchronize(self.handle),
               lambda: _s(lib.ferry_device_last_error(self._dev)), "ferry_stream_synchronize")

    def close(self):
        if self.handle and self._engine._h:
            lib.ferry_stream_destroy(self.handle)
        self.handle = None


class Engine:
    """The C engine API, one method per call: register (ferry_param_register),
    set_cancel, finalize, reserve, reserved, fetch, release, param_device, grads_ready,
    step, zero_grads, loss_scale, param_read, stats (ferry_engine_get_stats,
    as a dict), write_timeline, checkpoint_save, checkpoint_load,
    export_weights, device_info, grad_home. One thread at a time: a call while
    another thread is inside raises Error(FERRY_EBUSY)."""

    def __init__(self, config):
        self._lock = threading.RLock()
        self._inside = None
        cfg = config if isinstance(config, Config) else Config(config)
        h = ctypes.c_void_p()
        _check(lib.ferry_engine_create(cfg._h, None, ctypes.byref(h)),
               lambda: _s(lib.ferry_last_error()), "ferry_engine_create")
        self._h = h.value
        self._streams = []
        self._keep = []  # initial values and callbacks alive until finalize
        self._pd_param = ctypes.c_void_p()
        self._pd_grad = ctypes.c_void_p()
        self._stats = _lib.Stats()

    def _call(self, rc, name):
        if rc != 0:
            raise Error(rc, _s(lib.ferry_engine_last_error(self._h)), name)
        return rc

    def last_error(self):
        return _s(lib.ferry_engine_last_error(self._h))

    @_one_thread
    def stream(self, native=None):
        s = Stream(self, native)
        self._streams.append(s)
        return s

    @_one_thread
    def device_info(self):
        info = _lib.DeviceInfo()
        dev = lib.ferry_engine_device(self._h)
        _check(lib.ferry_device_get_info(dev, ctypes.byref(info)),
               lambda: _s(lib.ferry_device_last_error(dev)), "ferry_device_get_info")
        return {"name": _s(info.name), "kind": ("auto", "host", "cuda")[info.kind],
                "emulated": bool(info.emulated), "capacity": info.capacity, "used": info.used,
                "peak": info.peak}

    @_one_thread
    def register(self, name, shape, group, values=None, init=None):
        """values: None (zeros, or init), an address of count fp32 values (not
        checkable: the caller's word), or an object with the buffer protocol
        holding exactly count fp32 values (read at finalize at the latest:
        kept alive until then; another length or item type is refused).
        init: f(name, memoryview of count floats) called at finalize; the
        view is released when f returns (keep a copy, not the view)."""
        shape = [int(x) for x in shape]
        arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        cname = _c(name, "param name")
        count = 1
        for x in shape:
            count *= max(x, 0)
        addr = None
        if isinstance(values, int):
            addr = values
        elif values is not None:
            mv = memoryview(values)
            if mv.format not in ("f", "<f", "=f", "B", "b", "c"):
                raise Error(EINVAL, "register '%s': values hold items of format %r, not fp32 "
                            "('f')" % (name, mv.format), "ferry_param_register")
            mv = mv.cast("B")
            if mv.nbytes != 4 * count:
                raise Error(EINVAL, "register '%s': values hold %d bytes; shape %s needs %d fp32 "
                            "values (%d bytes)" % (name, mv.nbytes, shape, count, 4 * count),
                            "ferry_param_register")
            buf = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv) if mv.readonly else \
                (ctypes.c_char * mv.nbytes).from_buffer(mv)
            self._keep.append((values, buf))
            addr = ctypes.addressof(buf)
        cb = ctypes.cast(None, _lib.INIT_FN)
        if init is not None:
            def _thunk(user, cname, dst, count, _init=init):
                views = []
                try:
                    arr = (ctypes.c_float * count).from_address(ctypes.addressof(dst.contents))
                    views.append(memoryview(arr))
                    views.append(views[0].cast("B"))
                    views.append(views[1].cast("f"))
                    _init(cname.decode(), views[2])
                    _release_views(views, arr)
                    return 0
                except Exception as exc:  # finalize raises with it
                    self._init_error = "init of '%s': %s: %s" % (cname.decode(),
                                                                 type(exc).__name__, exc)
                    return -1
            cb = _lib.INIT_FN(_thunk)
            self._keep.append(cb)
        self._call(lib.ferry_param_register(self._h, cname, arr, len(shape), int(group),
                                            addr, cb, None), "ferry_param_register")

    @_one_thread
    def set_cancel(self, fn):
        """Before finalize (ferry_engine_set_cancel): fn() is asked during
        finalize's long work, from its threads too (keep it quick); a true
        answer stops finalize, which raises Error(FERRY_ECANCELED). An
        exception in fn counts as a yes (finalize raises with it). None:
        never cancelled."""
        cb = ctypes.cast(None, _lib.CANCEL_FN)
        if fn is not None:
            def _thunk(user, _fn=fn):
                try:
                    return 1 if _fn() else 0
                except BaseException as exc:  # noqa: B036 (a C thread cannot raise)
                    self._cancel_error = "cancel: %s: %s" % (type(exc).__name__, exc)
                    return 1
            cb = _lib.CANCEL_FN(_thunk)
        self._call(lib.ferry_engine_set_cancel(self._h, cb, None), "ferry_engine_set_cancel")
        self._cancel_cb = cb  # alive while the engine may call it

    @_one_thread
    def finalize(self):
        self._init_error = None
        self._cancel_error = None
        try:
            rc = lib.ferry_engine_finalize(self._h)
            why = self._init_error or self._cancel_error
            if rc and why:
                raise Error(rc, "%s (%s)" % (why, self.last_error()), "ferry_engine_finalize")
            self._call(rc, "ferry_engine_finalize")
        finally:
            self._keep = []

    @_one_thread
    def reserve(self, nbytes):
        self._call(lib.ferry_engine_reserve(self._h, nbytes), "ferry_engine_reserve")

    @_one_thread
    def reserved(self):
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        self._call(lib.ferry_engine_reserved(self._h, ctypes.byref(p), ctypes.byref(n)),
                   "ferry_engine_reserved")
        return p.value, n.value

    @_one_thread
    def fetch(self, group, stream):
        self._call(lib.ferry_fetch(self._h, group, stream.handle), "ferry_fetch")

    @_one_thread
    def fetch_status(self, group, stream):
        """ferry_fetch's status without raising (FERRY_ENOMEM: no room)."""
        return lib.ferry_fetch(self._h, group, stream.handle)

    @_one_thread
    def release(self, group, stream):
        self._call(lib.ferry_release(self._h, group, stream.handle), "ferry_release")

    @_one_thread
    def param_device(self, name, param=True, grad=False):
        """(param pointer or None, grad pointer or None); name: str or bytes."""
        n = name if type(name) is bytes and b"\0" not in name else _c(name, "param name")
        self._call(lib.ferry_param_device(
            self._h, n, ctypes.byref(self._pd_param) if param else None,
            ctypes.byref(self._pd_grad) if grad else None), "ferry_param_device")
        return (self._pd_param.value if param else None, self._pd_grad.value if grad else None)

    @_one_thread
    def param_no_grad(self, name):
        """ferry_param_no_grad: the param got no gradient in this micro-batch
        (before its group's grads_ready)."""
        n = name if type(name) is bytes and b"\0" not in name else _c(name, "param name")
        self._call(lib.ferry_param_no_grad(self._h, n), "ferry_param_no_grad")

    @_one_thread
    def grads_ready(self, group, stream):
        self._call(lib.ferry_grads_ready(self._h, group, stream.handle), "ferry_grads_ready")

    @_one_thread
    def step(self):
        info = _lib.StepInfo()
        self._call(lib.ferry_step(self._h, ctypes.byref(info)), "ferry_step")
        return {"step": info.step, "skipped": bool(info.skipped), "grad_norm": info.grad_norm,
                "loss_scale": info.loss_scale, "clip_coef": info.clip_coef,
                "seconds": info.seconds}

    @_one_thread
    def zero_grads(self):
        self._call(lib.ferry_zero_grads(self._h), "ferry_zero_grads")

    @_one_thread
    def loss_scale(self):
        return lib.ferry_loss_scale(self._h)

    @_one_thread
    def param_read(self, name, out=None, count=None):
        """The fp32 master values: into `out` (an address or a writable buffer
        of count floats), or returned as an array('f')."""
        if out is None:
            import array
            out = array.array("f", bytes(4 * count))
        if isinstance(out, int):
            addr = out
        else:
            mv = memoryview(out).cast("B")
            count = mv.nbytes // 4
            addr = ctypes.addressof((ctypes.c_char * mv.nbytes).from_buffer(mv))
        self._call(lib.ferry_param_read(self._h, _c(name, "param name"), addr, count),
                   "ferry_param_read")
        return out

    @_one_thread
    def raw_stats(self):
        self._call(lib.ferry_engine_get_stats(self._h, ctypes.byref(self._stats)),
                   "ferry_engine_get_stats")
        return self._stats

    def stats(self):
        return _stats_dict(self.raw_stats())

    @_one_thread
    def write_timeline(self, path):
        self._call(lib.ferry_engine_write_timeline(self._h, _c(path, "timeline path", True)),
                   "ferry_engine_write_timeline")

    @_one_thread
    def grad_home(self):
        none = ctypes.c_int()
        t = lib.ferry_engine_grad_home(self._h, ctypes.byref(none))
        return "none" if none.value else _TIER_NAMES[t]

    @_one_thread
    def checkpoint_save(self, directory, blob=b"", keep=None, max_shard_bytes=None):
        opt = lib.ferry_checkpoint_options_default()
        if keep is not None:
            opt.keep = keep
        if max_shard_bytes is not None:
            opt.max_shard_bytes = max_shard_bytes
        blob = bytes(blob)
        self._call(lib.ferry_checkpoint_save(self._h, _c(directory, "checkpoint folder", True),
                                             blob or None,
                                             len(blob), ctypes.byref(opt)),
                   "ferry_checkpoint_save")

    @_one_thread
    def checkpoint_load(self, path):
        """Loads a checkpoint folder (or the newest of a DIR); returns its blob."""
        folder, _ = checkpoint_find(path)
        info = checkpoint_verify(folder)
        cap = int(info["blob_bytes"])
        buf = ctypes.create_string_buffer(max(1, cap))
        n = ctypes.c_size_t()
        self._call(lib.ferry_checkpoint_load(self._h, _c(folder, "checkpoint folder", True), buf, cap,
                                             ctypes.byref(n)), "ferry_checkpoint_load")
        return buf.raw[:n.value]

    @_one_thread
    def export_weights(self, path, max_shard_bytes=0):
        self._call(lib.ferry_export_weights(self._h, _c(path, "export path", True), max_shard_bytes),
                   "ferry_export_weights")

    @_one_thread
    def close(self):
        if getattr(self, "_h", None):
            for s in self._streams:
                s.close()
            self._streams = []
            lib.ferry_engine_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def checkpoint_find(path):
    """(folder, step) of the checkpoint ferry_checkpoint_load(path) would load."""
    buf = ctypes.create_string_buffer(4096)
    step = ctypes.c_int64()
    _check(lib.ferry_checkpoint_find(_c(path, "checkpoint path", True), buf, len(buf),
                                     ctypes.byref(step)),
           lambda: _s(lib.ferry_last_error()), "ferry_checkpoint_find")
    return buf.value.decode(), step.value


def checkpoint_verify(path):
    info = _lib.CheckpointInfo()
    _check(lib.ferry_checkpoint_verify(_c(path, "checkpoint path", True), ctypes.byref(info)),
           lambda: _s(lib.ferry_last_error()), "ferry_checkpoint_verify")
    return {"step": info.step, "blob_bytes": info.blob_bytes, "tensors": info.tensors,
            "total_bytes": info.total_bytes, "files": info.files, "path": _s(info.path)}
