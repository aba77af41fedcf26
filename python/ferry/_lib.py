"""ferry._lib: finds and loads libferry.so and declares, with ctypes, the
prototype of every C function and the layout of every struct the package uses.

Search order: the FERRY_LIB environment variable (the path of libferry.so, for
developers), then the copy bundled beside these modules (ferry/libferry.so, put
there by `pip install ./python`), then the installed library
(ctypes.util.find_library and the usual prefixes), then build/lib/ of the source
tree the package is imported from (a checkout on PYTHONPATH).
"""
import ctypes
import ctypes.util
import os

c_int, c_float, c_double, c_char_p, c_void_p, c_size_t = (
    ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p,
    ctypes.c_size_t)
c_int64, c_uint64 = ctypes.c_int64, ctypes.c_uint64
P = ctypes.POINTER

TIERS, FAMILIES = 3, 3


class Stats(ctypes.Structure):
    """Mirrors ferry_stats (include/ferry/engine.h) field for field."""
    _fields_ = [
        ("budget", c_uint64 * TIERS),
        ("current", (c_uint64 * FAMILIES) * TIERS),
        ("peak", (c_uint64 * FAMILIES) * TIERS),
        ("tier_current", c_uint64 * TIERS),
        ("tier_peak", c_uint64 * TIERS),
        ("bytes_h2d", c_uint64), ("bytes_d2h", c_uint64),
        ("bytes_host_to_nvme", c_uint64), ("bytes_nvme_to_host", c_uint64),
        ("evictions", c_uint64 * TIERS),
        ("writebacks", c_uint64 * TIERS),
        ("fetches", c_uint64), ("fetch_hits", c_uint64),
        ("stalls", c_uint64),
        ("stall_seconds", c_double),
        ("metadata_bytes", c_uint64), ("managed_bytes", c_uint64),
        ("host_pageable_bytes", c_uint64),
        ("nvme_read_bytes", c_uint64 * FAMILIES),
        ("nvme_write_bytes", c_uint64 * FAMILIES),
        ("optim_bytes_per_param", c_double),
        ("comm_ops", c_uint64), ("comm_bytes", c_uint64),
        ("comm_seconds", c_double), ("comm_wait_seconds", c_double),
        ("nvme_reclaimed_files", c_uint64), ("nvme_reclaimed_bytes", c_uint64),
        ("nvme_file_bytes", c_uint64), ("nvme_data_bytes", c_uint64),
    ]


class StepInfo(ctypes.Structure):
    """Mirrors ferry_step_info."""
    _fields_ = [("step", c_int64), ("skipped", c_int), ("grad_norm", c_double),
                ("loss_scale", c_float), ("clip_coef", c_float), ("seconds", c_double)]


class CheckpointOptions(ctypes.Structure):
    """Mirrors ferry_checkpoint_options."""
    _fields_ = [("keep", c_int), ("max_shard_bytes", c_uint64)]


class CheckpointInfo(ctypes.Structure):
    """Mirrors ferry_checkpoint_info."""
    _fields_ = [("step", c_int64), ("blob_bytes", c_uint64), ("tensors", c_uint64),
                ("total_bytes", c_uint64), ("files", c_int), ("path", ctypes.c_char * 1024)]


class DeviceInfo(ctypes.Structure):
    """Mirrors ferry_device_info."""
    _fields_ = [("name", ctypes.c_char * 128), ("kind", c_int), ("emulated", c_int),
                ("capacity", c_size_t), ("used", c_size_t), ("peak", c_size_t),
                ("total_memory", c_size_t), ("free_memory", c_size_t),
                ("pcie_gen", c_int), ("pcie_width", c_int), ("host_lock_pinned", c_int)]


# The ctypes mirrors that python.stats_layout checks against the C compiler.
STRUCTS = {"ferry_stats": Stats, "ferry_step_info": StepInfo,
           "ferry_checkpoint_options": CheckpointOptions,
           "ferry_checkpoint_info": CheckpointInfo, "ferry_device_info": DeviceInfo}

INIT_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, P(c_float), c_size_t)
CANCEL_FN = ctypes.CFUNCTYPE(c_int, c_void_p)

# name: (restype, argtypes)
_PROTOS = {
    "ferry_version": (c_char_p, []),
    "ferry_strerror": (c_char_p, [c_int]),
    "ferry_last_error": (c_char_p, []),
    "ferry_dtype_size": (c_size_t, [c_int]),
    "ferry_dtype_convert": (c_int, [c_void_p, c_int, c_void_p, c_int, c_size_t, c_float]),
    # config
    "ferry_config_create": (c_int, [P(c_void_p)]),
    "ferry_config_destroy": (None, [c_void_p]),
    "ferry_config_last_error": (c_char_p, [c_void_p]),
    "ferry_config_load_file": (c_int, [c_void_p, c_char_p]),
    "ferry_config_load_string": (c_int, [c_void_p, c_char_p, c_char_p]),
    "ferry_config_set": (c_int, [c_void_p, c_char_p, c_char_p]),
    "ferry_config_get": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "ferry_config_write_file": (c_int, [c_void_p, c_char_p]),
    "ferry_config_key_count": (c_int, []),
    "ferry_config_key_info": (c_int, [c_int, P(c_char_p), P(c_char_p), P(c_char_p),
                                      P(c_char_p)]),
    # device and streams
    "ferry_cuda_compiled": (c_int, []),
    "ferry_device_last_error": (c_char_p, [c_void_p]),
    "ferry_device_get_info": (c_int, [c_void_p, P(DeviceInfo)]),
    "ferry_stream_create": (c_int, [c_void_p, P(c_void_p)]),
    "ferry_stream_wrap": (c_int, [c_void_p, c_void_p, P(c_void_p)]),
    "ferry_stream_destroy": (c_int, [c_void_p]),
    "ferry_stream_synchronize": (c_int, [c_void_p]),
    # engine
    "ferry_engine_create": (c_int, [c_void_p, c_void_p, P(c_void_p)]),
    "ferry_engine_destroy": (None, [c_void_p]),
    "ferry_engine_last_error": (c_char_p, [c_void_p]),
    "ferry_engine_device": (c_void_p, [c_void_p]),
    "ferry_param_register": (c_int, [c_void_p, c_char_p, P(c_int64), c_int, c_int, c_void_p,
                                     INIT_FN, c_void_p]),
    "ferry_engine_finalize": (c_int, [c_void_p]),
    "ferry_engine_set_cancel": (c_int, [c_void_p, CANCEL_FN, c_void_p]),
    "ferry_engine_reserve": (c_int, [c_void_p, c_size_t]),
    "ferry_engine_reserved": (c_int, [c_void_p, P(c_void_p), P(c_size_t)]),
    "ferry_fetch": (c_int, [c_void_p, c_int, c_void_p]),
    "ferry_release": (c_int, [c_void_p, c_int, c_void_p]),
    "ferry_param_device": (c_int, [c_void_p, c_char_p, P(c_void_p), P(c_void_p)]),
    "ferry_param_no_grad": (c_int, [c_void_p, c_char_p]),
    "ferry_grads_ready": (c_int, [c_void_p, c_int, c_void_p]),
    "ferry_step": (c_int, [c_void_p, P(StepInfo)]),
    "ferry_zero_grads": (c_int, [c_void_p]),
    "ferry_loss_scale": (c_float, [c_void_p]),
    "ferry_param_read": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "ferry_engine_write_timeline": (c_int, [c_void_p, c_char_p]),
    "ferry_engine_get_stats": (c_int, [c_void_p, P(Stats)]),
    "ferry_engine_grad_home": (c_int, [c_void_p, P(c_int)]),
    # checkpoints
    "ferry_checkpoint_options_default": (CheckpointOptions, []),
    "ferry_checkpoint_save": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t,
                                      P(CheckpointOptions)]),
    "ferry_checkpoint_load": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t, P(c_size_t)]),
    "ferry_checkpoint_find": (c_int, [c_char_p, c_char_p, c_size_t, P(c_int64)]),
    "ferry_checkpoint_verify": (c_int, [c_char_p, P(CheckpointInfo)]),
    "ferry_export_weights": (c_int, [c_void_p, c_char_p, c_uint64]),
}


def _candidates():
    env = os.environ.get("FERRY_LIB")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "libferry.so")  # the wheel's own copy
    if os.path.exists(bundled):
        # an installed wheel loads its own copy or says why not: another
        # libferry.so found further on would not match this package
        return [bundled], True
    out = []
    found = ctypes.util.find_library("ferry")
    if found:
        out.append(found)
    for prefix in ("/usr/local/lib", "/usr/lib", "/usr/local/lib64", "/usr/lib64",
                   "/usr/lib/x86_64-linux-gnu"):
        out.append(os.path.join(prefix, "libferry.so"))
    # python/ferry -> the tree's build/lib: a checkout on PYTHONPATH
    out.append(os.path.join(os.path.dirname(os.path.dirname(here)), "build", "lib", "libferry.so"))
    return out, False


def _load():
    names, only = _candidates()
    errors = []
    for n in names:
        if not only and os.path.isabs(n) and not os.path.exists(n):
            continue
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append("%s: %s" % (n, e))
    if only:
        what = ("FERRY_LIB=%s" % names[0]) if os.environ.get("FERRY_LIB") else (
            "the package's own %s" % names[0])
        raise ImportError("ferry: %s cannot be loaded: %s" % (what, "; ".join(errors)))
    raise ImportError("ferry: libferry.so not found (pip install ./python bundles it; or set "
                      "FERRY_LIB to its path, or build it in the source tree's build/); tried: %s"
                      % ("; ".join(errors) or ", ".join(names)))


lib = _load()
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
path = getattr(lib, "_name", "")
