#!/usr/bin/env python3
"""bench/peers/deepspeed/run_ds.py — the DeepSpeed peer of ferry's offload
placements: transformers' LlamaForCausalLM, built and loaded as
bench/peers/torch_llama.py builds it (the same config.json, initial weights,
data, sampler, loss and AdamW hyper-parameters), trained by a DeepSpeed
engine on one GPU with its optimizer (and params) offloaded.

  run_ds.py --placement offload|zero3_cpu|infinity --model PRESET|config.json
            --data FILE [--weights FILE|DIR] [--batch B] [--seq S] [--steps N]
            [--wheels DIR] [--site DIR] [--nvme-path DIR] ...

Placements, each a DeepSpeed config committed beside this file (the batch,
AdamW's hyper-parameters, clipping and the NVMe folder filled in from the
arguments): offload = ds_offload.json, ZeRO stage 2 with offload_optimizer
cpu (ZeRO-Offload); zero3_cpu = ds_zero3_cpu.json, stage 3 with
offload_optimizer and offload_param cpu; infinity = ds_infinity.json, stage
3 with both on nvme (ZeRO-Infinity, needs DeepSpeed's AIO op and libaio).
All bf16 with fp32 master weights and fp32 Adam states, gradient
checkpointing (non-reentrant), attention "sdpa".

DeepSpeed comes from the wheels prepare.sh assembled (--wheels, default
wheels/ beside this file), installed once with pip --no-index --no-deps
into --site (default /tmp/ferry-ds-site) and put first on sys.path. Its CPU
Adam op (and AIO for infinity) is built just in time and the build timed;
AIO against the libaio prepare.sh carries in WHEELS/libaio/ (CFLAGS, LDFLAGS,
CPATH, LIBRARY_PATH and LD_LIBRARY_PATH point at it, and it is loaded first).

Output: JSON lines, as torch_llama.py's: {"ds_build": ...} (the op builds'
seconds, or why AIO cannot build), one {"step", "loss", "tokens_per_s",
"ms"} per step, then {"final": true, "placement", "tokens_per_s" (median
over the steps after the first), "model_tflops" (torch_llama.py's flops per
token x tokens / time), "peak_bytes" (torch.cuda.max_memory_allocated),
"peak_device_used_bytes" (the device's used memory, as nvidia-smi shows it,
sampled every 0.1 s), "peak_rss_bytes" (this process's peak host RSS,
the model's build on the host included), "peak_rss_train_bytes" (the peak
sampled while training),
"losses", versions}. Without CUDA (or torch): one line {"skip": true,
"reason": ...} and exit 77. Exit 0; 1 a failure ({"error": ...}); 2 bad usage.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/peers: torch_llama
import torch_llama as tl  # noqa: E402

DS_VERSION = "0.19.8"
PLACEMENTS = {"offload": "ds_offload.json", "zero3_cpu": "ds_zero3_cpu.json",
              "infinity": "ds_infinity.json"}
SKIP = 77


def skip(reason):
    print(json.dumps({"skip": True, "reason": reason}), flush=True)
    sys.exit(SKIP)


def install_deepspeed(wheels, site):
    """DeepSpeed from the carried wheels into site (once), site first on sys.path."""
    have = [d for d in (os.listdir(site) if os.path.isdir(site) else [])
            if d.startswith("deepspeed-%s" % DS_VERSION) and d.endswith(".dist-info")]
    if not have:
        whl = sorted(os.path.join(wheels, w) for w in os.listdir(wheels)
                     if w.endswith(".whl")) if os.path.isdir(wheels) else []
        if not any(os.path.basename(w).startswith("deepspeed-") for w in whl):
            tl.fail("%s holds no deepspeed wheel: run bench/peers/deepspeed/prepare.sh "
                    "and carry that folder" % wheels)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                            "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                            "--target", site] + whl, capture_output=True, text=True)
        if r.returncode:
            tl.fail("pip install of %s failed: %s" % (wheels, r.stderr.strip()[-800:]))
    sys.path.insert(0, site)
    # the op builds run ninja and the compiler in children: they see it too
    os.environ["PYTHONPATH"] = site + os.pathsep + os.environ.get("PYTHONPATH", "")


def use_libaio(folder):
    """libaio carried by prepare.sh (wheels/libaio/{lib,include}), where it is:
    the AIO op's compile test and its build (gcc reads CFLAGS, LDFLAGS, CPATH
    and LIBRARY_PATH) find the header and library, its children load it
    (LD_LIBRARY_PATH), and this process has it loaded already, so that the
    built op's libaio.so.1 resolves to it. Returns the folder used, or None."""
    lib, inc = os.path.join(folder, "lib"), os.path.join(folder, "include")
    if not (os.path.isfile(os.path.join(lib, "libaio.so.1"))
            and os.path.isfile(os.path.join(inc, "libaio.h"))):
        return None
    for key, val in (("CFLAGS", "-I" + inc), ("LDFLAGS", "-L" + lib), ("CPATH", inc),
                     ("LIBRARY_PATH", lib), ("LD_LIBRARY_PATH", lib)):
        old = os.environ.get(key)
        sep = " " if key.endswith("FLAGS") else os.pathsep
        os.environ[key] = val + (sep + old if old else "")
    import ctypes
    ctypes.CDLL(os.path.join(lib, "libaio.so.1"), mode=ctypes.RTLD_GLOBAL)
    return folder


def build_ops(placement, libaio=None):
    """Build (or load the cached) CPU Adam, and AIO for infinity; timed."""
    from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder
    res = {"libaio": libaio or "the system's (none carried)"}
    t0 = time.time()
    CPUAdamBuilder().load()
    res["cpu_adam_s"] = time.time() - t0
    aio = AsyncIOBuilder()
    if aio.is_compatible(verbose=False):
        t0 = time.time()
        aio.load()
        res["aio_s"] = time.time() - t0
    else:
        res["aio"] = "not compatible here: DeepSpeed's AsyncIOBuilder finds no libaio " \
                     "(library and headers)%s" % (
                         "" if libaio else ": prepare.sh's wheels/libaio/ was not carried")
        if placement == "infinity":
            print(json.dumps({"ds_build": res}), flush=True)
            tl.fail("infinity needs DeepSpeed's AIO op, which cannot build: " + res["aio"])
    return res


def ds_config(a, n_max):
    """The placement's committed config with the run's values filled in."""
    with open(a.ds_config or os.path.join(HERE, PLACEMENTS[a.placement])) as f:
        cfg = json.load(f)
    cfg["train_micro_batch_size_per_gpu"] = a.batch
    cfg["gradient_accumulation_steps"] = 1
    cfg["gradient_clipping"] = a.clip_grad_norm
    cfg["optimizer"]["params"].update({"lr": a.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                       "weight_decay": a.weight_decay})
    z = cfg["zero_optimization"]
    for key in ("offload_optimizer", "offload_param"):
        if z.get(key, {}).get("device") == "nvme":
            z[key]["nvme_path"] = a.nvme_path
    if z.get("offload_param", {}).get("device") == "nvme":
        # a swap buffer holds the largest param whole
        z["offload_param"]["buffer_size"] = max(z["offload_param"].get("buffer_size", 0), n_max)
    return cfg


def param_groups(model, a):
    """torch_llama.py's AdamW groups: weight decay on matrices (or all)."""
    decay = [p for p in model.parameters() if a.decay == "all" or p.ndim >= 2]
    rest = [p for p in model.parameters() if not (a.decay == "all" or p.ndim >= 2)]
    groups = [{"params": decay, "weight_decay": a.weight_decay}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    return groups


class Peaks:
    """Sampled by a thread every 0.1 s while training: the device's used
    memory (total - free, nvidia-smi's figure) and this process's host RSS
    (/proc/self/statm), each's peak."""

    def __init__(self, torch):
        self.torch, self.peak, self.rss, self.stop = torch, 0, 0, threading.Event()
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            free, total = self.torch.cuda.mem_get_info(0)
            self.peak = max(self.peak, total - free)
            with open("/proc/self/statm") as f:
                self.rss = max(self.rss, int(f.read().split()[1]) * self.page)
            self.stop.wait(0.1)

    def done(self):
        self.stop.set()
        self.t.join()


def init_single_process(deepspeed):
    """One rank on one GPU, no launcher."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(k, v)
    deepspeed.init_distributed(dist_backend="nccl")


def train(a):
    import torch
    torch.manual_seed(a.seed)
    install_deepspeed(a.wheels, a.site)
    libaio = use_libaio(os.path.join(a.wheels, "libaio"))
    import deepspeed
    build = build_ops(a.placement, libaio)
    print(json.dumps({"ds_build": build}), flush=True)
    torch.cuda.set_device(0)
    init_single_process(deepspeed)
    dev = torch.device("cuda", 0)
    cfgd = tl.config_dict(a.model)
    if a.seq > cfgd["max_position_embeddings"]:
        tl.fail("--seq %d is over the model's %d positions" % (a.seq,
                                                               cfgd["max_position_embeddings"]), 2)
    sampler = tl.Sampler(tl.load_tokens(a.data, cfgd["vocab_size"]), a.seed)
    t_setup = time.time()
    # built in bf16 on the host, where the weights load; DeepSpeed places it
    model, tf_version = tl.build_model(torch, cfgd, a, torch.bfloat16, torch.device("cpu"))
    fpt, n_params = tl.flops_per_token(model, cfgd, a.seq)
    n_max = max(p.numel() for p in model.parameters())
    cfg = ds_config(a, n_max)
    if a.placement == "infinity":
        os.makedirs(a.nvme_path, exist_ok=True)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model, a),
                                           config=cfg)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    setup_s = time.time() - t_setup
    peaks = Peaks(torch)
    losses, times = [], []
    for step in range(1, a.steps + 1):
        x, y = sampler.batch(a.batch, a.seq)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = tl.lm_loss(torch, engine, x, y, dev)
        engine.backward(loss)
        engine.step()
        lv = float(loss.item())
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(lv)
        times.append(dt)
        print(json.dumps({"step": step, "loss": lv, "tokens_per_s": a.batch * a.seq / dt,
                          "ms": dt * 1e3}), flush=True)
    peaks.done()
    timed = sorted(times[1:] or times)
    med = timed[len(timed) // 2] if timed else None
    tokens = a.batch * a.seq
    fin = {"final": True, "peer": "deepspeed", "placement": a.placement,
           "zero_stage": cfg["zero_optimization"]["stage"],
           "offload_optimizer": cfg["zero_optimization"].get("offload_optimizer", {}).get("device"),
           "offload_param": cfg["zero_optimization"].get("offload_param", {}).get("device"),
           "steps": a.steps, "batch": a.batch, "seq": a.seq,
           "tokens_per_s": tokens / med if med else None,
           "model_tflops": fpt * tokens / med / 1e12 if med else None,
           "flops_per_token": fpt, "n_params": n_params,
           "median_step_ms": med * 1e3 if med else None, "losses": losses,
           "peak_bytes": torch.cuda.max_memory_allocated(),
           "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
           "peak_device_used_bytes": peaks.peak,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "peak_rss_train_bytes": peaks.rss,
           "setup_s": setup_s, "ds_build": build, "dtype": "bf16", "attn": a.attn,
           "checkpointing": a.checkpointing, "decay": a.decay,
           "clip_grad_norm": a.clip_grad_norm, "lr": a.lr, "weight_decay": a.weight_decay,
           "weights": a.weights or "transformers' random init",
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": tf_version, "deepspeed": deepspeed.__version__}
    print(json.dumps(fin), flush=True)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="run_ds.py", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placement", choices=sorted(PLACEMENTS), default="offload",
                    help="the DeepSpeed config (default offload: ZeRO-2, optimizer on cpu)")
    ap.add_argument("--ds-config", help="a DeepSpeed config file instead of the placement's")
    tl.add_run_args(ap)  # model, weights, data, batch, ... as torch_llama.py's
    ap.add_argument("--wheels", default=os.path.join(HERE, "wheels"),
                    help="prepare.sh's wheels (default: wheels/ beside this file)")
    ap.add_argument("--site", default="/tmp/ferry-ds-site",
                    help="where DeepSpeed is installed (default /tmp/ferry-ds-site)")
    ap.add_argument("--nvme-path", default="/tmp/ferry-ds-nvme",
                    help="infinity's swap folder (default /tmp/ferry-ds-nvme)")
    a = ap.parse_args(argv)
    if min(a.batch, a.seq) < 1 or a.steps < 0:
        ap.error("--batch and --seq must be positive, --steps not negative")
    if not a.model or not a.data:
        ap.error("training needs --model and --data")
    try:
        import torch
    except ImportError:
        skip("cannot import torch: the DeepSpeed peer needs torch with CUDA")
    if not torch.cuda.is_available():
        skip("torch %s sees no CUDA device: the DeepSpeed peer runs on a GPU only"
             % torch.__version__)
    return train(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
