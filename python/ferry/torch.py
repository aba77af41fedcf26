"""ferry.torch: trains any torch.nn.Module through a ferry engine, DeepSpeed style.

    engine = ferry.torch.initialize(model, {"device": "host", ...})
    loss = loss_fn(engine(batch))
    engine.backward(loss)
    engine.step()

Owns the mapping between the model's parameters and the engine: registration,
the hooks that fetch a group before a module runs and hand its grads in as
soon as they are final, the saved-tensor records that let backward (and
torch.utils.checkpoint recompute) find a param's buffer again after it was
reused, loss scaling, checkpoints with a client state. python/README.md
describes the design.

What a torch user expects, or a clear error: backward(loss) takes each
micro-batch's loss as is and the engine averages the grad_accumulation
micro-batches (each one's grads times 1/grad_accumulation, as DeepSpeed
does: torch's (loss / grad_accumulation).backward()); a backward more than
grad_accumulation before step(), a param whose dtype or device changed after
initialize, or a call while another thread is inside the engine raise
ferry.Error before anything changes; an exception inside backward rolls the
pass back (or, when groups were handed in already, says to call
zero_grad()); model.state_dict() (save_pretrained) gives the engine's values
while it trains; initialize refuses a device budget that cannot hold the
groups one forward holds at once. A param whose .grad stays None in a whole
step (an unused expert) is left as it is, as torch.optim does: no update,
no weight decay, its own step count unchanged (optimizer.missing_grad =
"zero" steps it with zero grads instead, as DeepSpeed does).
"""
import contextlib
import ctypes
import os
import pickle
import signal
import threading
from collections import OrderedDict

import torch
from torch import nn

import ferry

__all__ = ["initialize", "TorchEngine", "default_groups"]

_TORCH_DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_FERRY_DT = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}  # ferry_dtype
# __cuda_array_interface__ has no bf16 type string: such buffers are made as
# int16 and viewed as bf16.
_CAI = {torch.float32: ("<f4", None), torch.float16: ("<f2", None),
        torch.bfloat16: ("<i2", torch.bfloat16)}
_HAS_POST_ACC = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
_VIEW_CACHE = 8  # pointers remembered per param


class _CudaBuffer:
    """A device pointer as an object torch.as_tensor understands."""

    def __init__(self, ptr, n, typestr):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr,
                                         "data": (ptr, False), "version": 2, "strides": None}


class _Rec:
    """What a saved tensor over a param buffer is replaced by during forward:
    the param, the view's geometry, and the last view rebuilt from it."""
    __slots__ = ("i", "size", "stride", "offset", "base", "view")

    def __init__(self, i, size, stride, offset):
        self.i, self.size, self.stride, self.offset = i, size, stride, offset
        self.base = self.view = None


def default_groups(model, names_params):
    """The default grouping: one group per child of the model's largest
    nn.ModuleList (by parameter count), one for the params registered before
    it and one for those after. Returns (group of each param, group labels)."""
    best, best_n, best_name = None, 0, ""
    for mname, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            n = sum(p.numel() for p in m.parameters())
            if n > best_n:
                best, best_n, best_name = m, n, mname
    if best is None:
        return [0] * len(names_params), ["all"]
    child_of = {}
    labels_mid = []
    for k, (cname, child) in enumerate(best.named_children()):
        labels_mid.append((best_name + "." if best_name else "") + cname)
        for p in child.parameters():
            child_of.setdefault(id(p), k)
    first = next((j for j, (_, p) in enumerate(names_params) if id(p) in child_of),
                 len(names_params))
    raw = []
    for j, (_, p) in enumerate(names_params):
        if id(p) in child_of:
            raw.append(1 + child_of[id(p)])
        else:
            raw.append(0 if j < first else 1 + len(labels_mid))
    labels = ["<before>"] + labels_mid + ["<after>"]
    used = sorted(set(raw))
    renum = {g: k for k, g in enumerate(used)}
    return [renum[g] for g in raw], [labels[g] for g in used]


def _prefix_groups(names_params, prefixes):
    out, missing = [], []
    for name, _ in names_params:
        best, best_len = None, -1
        for k, pre in enumerate(prefixes):
            if (pre == "" or name == pre or name.startswith(pre + ".")) and len(pre) > best_len:
                best, best_len = k, len(pre)
        if best is None:
            missing.append(name)
        out.append(best)
    if missing:
        raise ValueError("ferry.torch: parameters in none of the groups %r: %s"
                         % (list(prefixes), ", ".join(missing)))
    used = sorted(set(out))
    empty = [prefixes[k] for k in range(len(prefixes)) if k not in used]
    if empty:
        raise ValueError("ferry.torch: groups with no trainable parameter: %s" % ", ".join(empty))
    return out, list(prefixes)


@contextlib.contextmanager
def _sigint_cancels(engine):
    """Around finalize (gigabytes of state may be written): Ctrl-C stops it.
    A SIGINT handler sets a flag that the engine's cancel reads (Python runs
    the handler on the main thread, which finalize asks from too); a
    cancelled finalize closes the engine (its swap files go) and raises
    KeyboardInterrupt, as does a SIGINT that came after the last ask. Only
    on the main thread with Python's own SIGINT handler in place; the
    handler is restored after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    hit = []
    engine.set_cancel(lambda: hit)
    old = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    except ferry.Error as exc:
        if not hit or exc.status != ferry.ECANCELED:
            raise
        engine.close()
        raise KeyboardInterrupt("ferry.torch.initialize: %s" % exc.message) from None
    finally:
        signal.signal(signal.SIGINT, old)
    if hit:
        engine.close()
        raise KeyboardInterrupt("ferry.torch.initialize: SIGINT during the engine's set-up")


class TorchEngine:
    """A model whose trainable parameters live in a ferry engine. Call it as
    the model; then backward(loss) and step(). Attributes: module (the model),
    engine (the ferry.Engine), groups (labels), dtype (params), compute_dtype
    (what the model sees), last_step (the info of the last ferry_step).
    One thread at a time: a call while another thread is inside raises
    ferry.Error(FERRY_EBUSY)."""

    def __init__(self, model, config, groups=None, compute_dtype=None):
        self._lock = threading.RLock()
        self._inside = None
        self.module = model
        self.config = config if isinstance(config, ferry.Config) else ferry.Config(config)
        prec = self.config.get("precision.params")
        self.dtype = _TORCH_DT[prec]
        self._fdt = _FERRY_DT[self.dtype]
        self.accumulation = int(self.config.get("grad_accumulation"))
        self._zero_missing = self.config.get("optimizer.missing_grad") == "zero"
        self.engine = ferry.Engine(self.config)
        self.cuda = self.engine.device_info()["kind"] == "cuda"
        if self.cuda:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        if compute_dtype is None:
            # CPU torch has no fp16 matmul or layer norm: fp16 params compute in fp32 there
            compute_dtype = torch.float32 if (self.dtype == torch.float16 and not self.cuda) \
                else self.dtype
        self.compute_dtype = compute_dtype
        self._scratch_mode = compute_dtype != self.dtype

        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("ferry.torch: the model has no trainable parameter")
        if groups is None:
            gof, self.groups = default_groups(model, named)
        else:
            gof, self.groups = _prefix_groups(named, list(groups))
        order = sorted(range(len(named)), key=lambda j: gof[j])  # registration by group
        self._names = [named[j][0] for j in order]
        self._p = [named[j][1] for j in order]
        self._group_of = [gof[j] for j in order]
        self._name_b = [n.encode() for n in self._names]
        self._shape = [tuple(p.shape) for p in self._p]
        self._numel = [p.numel() for p in self._p]
        self._pid = {id(p): i for i, p in enumerate(self._p)}
        G = len(self.groups)
        self._gparams = [[] for _ in range(G)]
        for i, g in enumerate(self._group_of):
            self._gparams[g].append(i)

        for i, p in enumerate(self._p):  # initial values from the module, fp32
            v = p.detach().to("cpu", torch.float32).contiguous()
            # the engine's tensors have 1..8 dims: a 0-dim param is registered as [1]
            self.engine.register(self._names[i], self._shape[i] or (1,), self._group_of[i],
                                 v.data_ptr() if v.numel() else None)
            self.engine._keep.append(v)
        with _sigint_cancels(self.engine):
            self.engine.finalize()
        self._check_budget()

        if self.cuda:
            self.stream = self.engine.stream(torch.cuda.current_stream(self.device).cuda_stream)
        else:
            self.stream = self.engine.stream()
        self._placeholder = torch.empty(0, dtype=compute_dtype, device=self.device)
        self._views = [OrderedDict() for _ in self._p]  # param buffer views by pointer
        self._gviews = [OrderedDict() for _ in self._p]  # grad buffer views by pointer
        self._cur = [None] * len(self._p)  # what p.data is while fetched
        self._scratch = [None] * len(self._p)  # fp32 copies (fp16 params on the CPU)
        self._scratch_ok = [False] * len(self._p)
        self._fetched = [False] * G
        self._pin = [0] * G
        self._lru = OrderedDict()  # fetched groups, least recently used first
        self._recs = {}
        self._got = [False] * len(self._p)
        self._left = [sum(1 for i in ps if self._numel[i]) for ps in self._gparams]
        self._handed = [False] * G
        self._slot_open = [False] * G
        self._micro = 0
        self._in_backward = False
        self._pre_seen = [False] * len(self._p)  # the pre-grad hook ran in this pass
        self._broken = None  # why backward and step refuse until zero_grad()
        self._lost = None  # why every call refuses (torch dropped grad hooks)
        self._step_got = [False] * len(self._p)  # a grad in some micro-batch of this step
        self._warned_nograd = False
        self.last_step = None
        # counters the tests read: tensors made by the hooks
        self.views_made = 0
        self.records_made = 0
        self.unpack_views = 0

        self._handles = []
        self._acc = []  # AccumulateGrad nodes, kept alive so their hooks stay
        with torch.enable_grad():
            for i, p in enumerate(self._p):
                # the accumulator records the param's shape, dtype and device now
                p.data = torch.empty((), dtype=compute_dtype, device=self.device).expand(
                    self._shape[i])
                self._handles.append(p.register_hook(self._make_pre_grad(i)))
                if _HAS_POST_ACC:
                    self._handles.append(
                        p.register_post_accumulate_grad_hook(self._make_post_grad(i)))
                else:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._acc.append(acc)
                    post = self._make_post_grad(i)
                    self._handles.append(acc.register_hook(lambda gi, go, post=post: post(None)))
                p.data = self._placeholder
                p.grad = None
        for m in model.modules():
            gs = sorted({self._group_of[self._pid[id(p)]] for p in m._parameters.values()
                         if p is not None and id(p) in self._pid})
            if gs:
                gs = tuple(gs)
                self._handles.append(m.register_forward_pre_hook(self._make_fwd_pre(gs)))
                self._handles.append(m.register_forward_hook(self._make_fwd_post(gs)))
                self._handles.append(m._register_state_dict_hook(self._state_dict_hook))

    # -- checks ---------------------------------------------------------------

    def _group_bytes(self):
        """Each group's device bytes: its params packed as memory/layout.c
        packs them (256-byte aligned offsets, chunks of at most chunk_size
        that hold one group, a param larger than a chunk in one of its own),
        each chunk's size aligned to 4096 bytes (the swap store's alignment)
        when the params live off the device and any family lives on NVMe,
        else to 256."""
        cs = int(self.config.get("chunk_size"))
        es = torch.tensor([], dtype=self.dtype).element_size()
        place = [self.config.get("placement." + f) for f in ("params", "grads", "optimizer")]
        a = 4096 if place[0] in ("host", "nvme") and "nvme" in place else 256

        def up(x, a=256):
            return (x + a - 1) // a * a
        out = [0] * len(self.groups)
        for g, ps in enumerate(self._gparams):
            fill = None
            for i in ps:
                b = self._numel[i] * es
                off = up(fill) if fill is not None else 0
                if b > cs or fill is None or off + b > cs:
                    if fill is not None:
                        out[g] += up(fill, a)
                    off = 0
                fill = off + max(b, 1)
                if b > cs:
                    out[g] += up(fill, a)
                    fill = None
            if fill is not None:
                out[g] += up(fill, a)
        return out

    def _check_budget(self):
        """The device tier must hold at once the groups one forward pins: a
        module's own and those of every module around it (their forward
        hooks hold them while it runs). Refused here, not at the first
        forward."""
        room = self.engine.stats()["tiers"]["device"]["budget"]
        gb = self._group_bytes()
        own = {}
        for m in self.module.modules():
            own[id(m)] = {self._group_of[self._pid[id(p)]] for p in m._parameters.values()
                          if p is not None and id(p) in self._pid}
        worst, worst_gs = 0, ()
        stack = [(self.module, frozenset())]
        seen = set()
        while stack:
            m, outer = stack.pop()
            gs = outer | own[id(m)]
            if (id(m), gs) in seen:
                continue
            seen.add((id(m), gs))
            need = sum(gb[g] for g in gs)
            if need > worst:
                worst, worst_gs = need, tuple(sorted(gs))
            stack.extend((c, gs) for c in m.children())
        if worst > room:
            raise ferry.Error(ferry.ENOMEM, "the device tier has %d bytes for params "
                              "(tiers.gpu.budget less the engine's gradient buffers), but a "
                              "forward holds groups %s (%s) at once: at least %d bytes; raise "
                              "tiers.gpu.budget by %d bytes or more, or make the groups smaller"
                              % (room, list(worst_gs), ", ".join(self.groups[g] for g in worst_gs),
                                 worst, worst - room), "initialize")

    def _check_params(self, op):
        """Each param is still the engine's: its dtype and device as set at
        initialize. model.double(), .to(dtype), p.data = ... change them, and
        torch then drops the param's gradient hooks: refused, never trained
        with lost grads."""
        if self._lost or self._broken:
            raise ferry.Error(ferry.ESTATE, self._lost or self._broken, op)
        for i, p in enumerate(self._p):
            if p.dtype != self.compute_dtype or p.device != self.device:
                raise ferry.Error(
                    ferry.EINVAL, "parameter '%s' is %s on %s now; the engine trains it as "
                    "%s on %s: a dtype or device change after initialize (model.double(), "
                    "model.to(...), p.data = ...) is not supported (torch drops the param's "
                    "gradient hooks); choose precision.params and compute_dtype at initialize"
                    % (self._names[i], p.dtype, p.device, self.compute_dtype, self.device), op)

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        """module.state_dict() while the engine trains: the engine's values
        (the fp32 masters in the compute dtype, as close() leaves them), not
        the zero-element placeholders."""
        for name, p in module._parameters.items():
            i = self._pid.get(id(p)) if p is not None else None
            if i is not None and prefix + name in state_dict:
                state_dict[prefix + name] = self.read_param(self._names[i]).to(
                    self.device, self.compute_dtype)

    # -- fetch and release ------------------------------------------------

    def _make_view(self, ptr, n, dtype):
        if self.cuda:
            typestr, view_as = _CAI[dtype]
            t = torch.as_tensor(_CudaBuffer(ptr, n, typestr), device=self.device)
            return t.view(view_as) if view_as is not None else t
        nbytes = n * torch.tensor([], dtype=dtype).element_size()
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)

    def _cached(self, cache, i, ptr, dtype):
        v = cache.get(ptr)
        if v is None:
            v = self._make_view(ptr, self._numel[i], dtype).view(self._shape[i])
            if len(cache) >= _VIEW_CACHE:
                cache.popitem(last=False)
            cache[ptr] = v
            self.views_made += 1
        return v

    def _fetch(self, g):
        e, s = self.engine, self.stream
        while True:
            rc = e.fetch_status(g, s)
            if rc == 0:
                break
            victim = None
            if rc == ferry.ENOMEM:
                for x in self._lru:
                    if self._pin[x] == 0 and x != g:
                        victim = x
                        break
            if victim is None:
                raise ferry.Error(rc, e.last_error(), "ferry_fetch")
            self._release(victim)
        if not self.cuda:
            s.synchronize()  # the copies in, before this thread's kernels read them
        for i in self._gparams[g]:
            if self._numel[i] == 0:
                continue
            ptr = e.param_device(self._name_b[i])[0]
            v = self._cached(self._views[i], i, ptr, self.dtype)
            if self._scratch_mode:
                sc = self._scratch[i]
                if sc is None:
                    sc = self._scratch[i] = torch.empty(self._shape[i], dtype=self.compute_dtype,
                                                        device=self.device)
                    self.views_made += 1
                if not self._scratch_ok[i]:
                    sc.copy_(v)
                    self._scratch_ok[i] = True
                v = sc
            self._cur[i] = v
            self._p[i].data = v
        self._fetched[g] = True
        self._lru[g] = None

    def _ensure(self, g):
        if self._fetched[g]:
            self._lru.move_to_end(g)
        else:
            self._fetch(g)

    def _release(self, g):
        self.engine.release(g, self.stream)
        ph = self._placeholder
        for i in self._gparams[g]:
            self._p[i].data = ph
            self._cur[i] = None
        self._fetched[g] = False
        del self._lru[g]

    def _release_all(self):
        while self._lru:
            self._release(next(iter(self._lru)))
        for g in range(len(self._pin)):
            self._pin[g] = 0

    def _make_fwd_pre(self, gs):
        def hook(mod, inp):
            for g in gs:
                self._pin[g] += 1
            for g in gs:
                self._ensure(g)
        return hook

    def _make_fwd_post(self, gs):
        def hook(mod, inp, out):
            for g in gs:
                if self._pin[g] > 0:
                    self._pin[g] -= 1
        return hook

    # -- saved tensors ------------------------------------------------------

    def _pack(self, t):
        b = t._base
        i = self._pid.get(id(t if b is None else b))
        if i is None:
            return t
        key = (i, t.size(), t.stride(), t.storage_offset())
        r = self._recs.get(key)
        if r is None:
            r = self._recs[key] = _Rec(*key)
            self.records_made += 1
        return r

    def _unpack(self, r):
        if type(r) is not _Rec:
            return r
        i = r.i
        self._ensure(self._group_of[i])
        cur = self._cur[i]
        if r.base is not cur:
            r.view = cur.as_strided(r.size, r.stride, r.offset)
            r.base = cur
            self.unpack_views += 1
        return r.view

    def _hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    # -- gradients ----------------------------------------------------------

    def _make_pre_grad(self, i):
        def hook(grad):
            if not self._in_backward:
                raise RuntimeError("ferry.torch: a gradient for '%s' outside engine.backward: "
                                   "call engine.backward(loss), not loss.backward()"
                                   % self._names[i])
            self._pre_seen[i] = True
            g = self._group_of[i]
            if self._handed[g]:
                raise RuntimeError("ferry.torch: a gradient for '%s' arrived after its group %d "
                                   "(%s) was handed in" % (self._names[i], g, self.groups[g]))
            self._ensure(g)  # torch accumulates into a param of the right shape
        return hook

    def _grad_ptr(self, i):
        g = self._group_of[i]
        gptr = self.engine.param_device(self._name_b[i], param=False, grad=True)[1]
        if not self._slot_open[g]:
            self._slot_open[g] = True
            if not self.cuda:
                self.stream.synchronize()  # the slot's zeroing is on the stream
        return gptr

    def _grad_view(self, i):
        return self._cached(self._gviews[i], i, self._grad_ptr(i), self.dtype)

    def _grad_copy(self, i, grad):
        """grad into the engine's grad buffer. On the host backend a memcpy (or
        ferry_dtype_convert) to the pointer, so no tensor is made: the drain
        hands out its slots in no fixed order, and views per slot would keep
        being made."""
        if self.cuda:
            self._grad_view(i).copy_(grad)
            return
        gptr = self._grad_ptr(i)
        if not grad.is_contiguous():
            grad = grad.contiguous()
        if grad.dtype == self.dtype:
            ctypes.memmove(gptr, grad.data_ptr(), self._numel[i] * grad.element_size())
        else:
            rc = ferry._lib.lib.ferry_dtype_convert(gptr, self._fdt, grad.data_ptr(),
                                                    _FERRY_DT[grad.dtype], self._numel[i], 1.0)
            if rc:
                raise ferry.Error(rc, "grad of '%s': cannot convert %s" % (self._names[i],
                                                                          grad.dtype))

    def _make_post_grad(self, i):
        p = self._p[i]

        def hook(_):
            grad = p.grad
            p.grad = None
            if grad is None:
                return
            g = self._group_of[i]
            if self._got[i]:  # a second backward of it in this pass (reentrant)
                self._grad_view(i).add_(grad)
            else:
                self._grad_copy(i, grad)
                self._got[i] = True
                self._left[g] -= 1
                if self._left[g] == 0:
                    self._hand_in(g)
        return hook

    def _hand_in(self, g):
        self.engine.grads_ready(g, self.stream)
        self._handed[g] = True
        self._slot_open[g] = False
        if self._fetched[g] and self._pin[g] == 0:
            self._release(g)

    def _finish_backward(self):
        lost = [self._names[i] for i in range(len(self._p)) if self._pre_seen[i] and
                not self._got[i]]
        if lost:  # torch dropped the hook that hands the grad in: for good
            self._lost = ("the gradients of %s reached torch but not the engine: their dtype or "
                          "device was changed after initialize (and maybe back), which makes "
                          "torch drop their gradient hooks; initialize again, with "
                          "precision.params and compute_dtype set as needed"
                          % ", ".join("'%s'" % n for n in lost[:4]))
            raise ferry.Error(ferry.EINVAL, self._lost, "backward")
        for g in range(len(self.groups)):
            if self._handed[g]:
                continue
            self._ensure(g)
            none = [i for i in self._gparams[g] if not self._got[i] and self._numel[i]]
            for i in none:  # zeros for the params that got no grad
                self._grad_ptr(i)
            if not self._slot_open[g]:
                raise RuntimeError("ferry.torch: group %d has no gradient buffer" % g)
            for i in none:  # torch: their .grad stays None (right before the hand-in)
                self.engine.param_no_grad(self._name_b[i])
            self._hand_in(g)
        self._release_all()
        for i in range(len(self._got)):
            self._step_got[i] = self._step_got[i] or self._got[i]
        self._reset_pass()

    def _reset_pass(self):
        for i in range(len(self._got)):
            self._got[i] = False
            self._pre_seen[i] = False
        for g in range(len(self._left)):
            self._left[g] = sum(1 for i in self._gparams[g] if self._numel[i])
            self._handed[g] = False
            self._slot_open[g] = False

    def _rollback(self, exc):
        """After an exception inside backward: the grads copied into buffers
        of groups not handed in are zeroed (the engine keeps such a buffer
        for the group's next pass), the pass state is reset, and when some
        groups had handed theirs in (the engine has part of a micro-batch)
        backward and step refuse until zero_grad()."""
        handed = [g for g in range(len(self.groups)) if self._handed[g]]
        try:
            for g in range(len(self.groups)):
                if self._handed[g] or not self._slot_open[g]:
                    continue
                self._ensure(g)
                for i in self._gparams[g]:
                    if self._got[i] and self._numel[i]:
                        if self.cuda:
                            self._grad_view(i).zero_()
                        else:
                            ctypes.memset(self._grad_ptr(i), 0,
                                          self._numel[i] * torch.tensor([], dtype=self.dtype)
                                          .element_size())
            self._release_all()
        except BaseException as e2:  # the engine itself failed: nothing is trusted
            handed = handed or ["?"]
            exc = "%s, then %s while rolling back" % (exc, e2)
        self._reset_pass()
        if handed:
            self._broken = (
                "the last backward stopped (%s) after groups %s had handed in their grads (with "
                "step_during_backward their updates may have run); call zero_grad() to drop "
                "this step's grads, then run the step's micro-batches again"
                % (exc, ", ".join(str(g) if g == "?" else "%d (%s)" % (g, self.groups[g])
                                  for g in handed)))

    # -- the training-loop API ----------------------------------------------

    @ferry._one_thread
    def __call__(self, *args, **kwargs):
        """The model's forward, its params fetched group by group."""
        self._check_params("forward")
        try:
            with self._hooks():
                return self.module(*args, **kwargs)
        finally:
            self._release_all()

    forward = __call__

    @ferry._one_thread
    def backward(self, loss):
        """loss.backward() with the engine's loss scale (fp16), then every
        group's grads handed in. Call it, not loss.backward(). loss: the
        micro-batch's loss as is; with grad_accumulation = N the engine
        scales each micro-batch's grads by 1/N (the step sees their mean, as
        torch's (loss / N).backward() per micro-batch gives). Refused
        (ferry.Error, FERRY_ESTATE) once N micro-batches ran backward since
        the last step(): call step() first. An exception inside rolls the
        pass back, so the next backward works; if groups had handed their
        grads in already, backward and step refuse until zero_grad()."""
        self._check_params("backward")
        if self._micro >= self.accumulation:
            raise ferry.Error(ferry.ESTATE, "grad_accumulation = %d micro-batch(es) ran "
                              "backward since the last step(); call step() before the next "
                              "backward (the update runs during backward: another one would "
                              "move the weights again)" % self.accumulation, "backward")
        scale = self.engine.loss_scale()
        if scale != 1.0:
            loss = loss * scale
        self._in_backward = True
        try:
            with self._hooks():
                loss.backward()
            self._finish_backward()
        except BaseException as exc:
            self._rollback("%s: %s" % (type(exc).__name__, exc))
            raise
        finally:
            self._in_backward = False
        self._micro += 1

    @ferry._one_thread
    def step(self):
        """ferry_step once grad_accumulation micro-batches are in; returns its
        info (dict: step, skipped, grad_norm, loss_scale, clip_coef, seconds),
        or None between micro-batches."""
        self._check_params("step")
        if self._micro < self.accumulation:
            return None
        self._micro = 0
        self._release_all()
        if self._zero_missing:
            self._warn_nograd()
        for i in range(len(self._step_got)):
            self._step_got[i] = False
        info = self.engine.step()
        self._invalidate()
        self.last_step = info
        return info

    def _warn_nograd(self):
        """optimizer.missing_grad = zero: params that got no grad in the whole
        step are stepped with zeros (DeepSpeed's behaviour; torch, and the
        default "skip", leave them as they are): said once per engine."""
        missing = [self._names[i] for i in range(len(self._p))
                   if self._numel[i] and not self._step_got[i]]
        if missing and not self._warned_nograd:
            self._warned_nograd = True
            import warnings
            warnings.warn("ferry.torch: %d param(s) got no gradient in this step (%s): the engine "
                          "steps them with zero grads, so weight decay and momentum still move "
                          "them (optimizer.missing_grad = zero, DeepSpeed's behaviour); torch "
                          "would leave them unchanged"
                          % (len(missing), ", ".join(missing[:3])), RuntimeWarning, stacklevel=3)

    @ferry._one_thread
    def zero_grad(self):
        """Drops the grads of this step's micro-batches (ferry_zero_grads):
        after a backward that stopped part way, the step starts again."""
        self._release_all()
        self.engine.zero_grads()
        self._micro = 0
        self._broken = None
        for i in range(len(self._step_got)):
            self._step_got[i] = False

    def loss_scale(self):
        return self.engine.loss_scale()

    def _invalidate(self):
        for i in range(len(self._scratch_ok)):
            self._scratch_ok[i] = False

    @ferry._one_thread
    def save_checkpoint(self, directory, client_state=None, keep=None):
        """ferry_checkpoint_save into directory/step-N/, client_state (any
        picklable object) in its blob."""
        self._release_all()
        os.makedirs(directory, exist_ok=True)
        blob = pickle.dumps(client_state) if client_state is not None else b""
        self.engine.checkpoint_save(directory, blob, keep=keep)

    @ferry._one_thread
    def load_checkpoint(self, path):
        """Loads a checkpoint folder (or the newest in a directory); returns its
        client_state. The blob is unpickled: load only checkpoints you trust."""
        self._release_all()
        blob = self.engine.checkpoint_load(path)
        self._invalidate()
        return pickle.loads(blob) if blob else None

    def stats(self):
        """ferry_engine_get_stats as a dict (tiers -> budget, current, peak, ...)."""
        return self.engine.stats()

    def timeline(self, path):
        """Writes the engine's timeline (Chrome trace JSON)."""
        self.engine.write_timeline(path)

    @ferry._one_thread
    def read_param(self, name):
        """A parameter's fp32 master values as a CPU tensor."""
        i = self._names.index(name)
        t = torch.empty(self._shape[i], dtype=torch.float32)
        self.engine.param_read(name, t.data_ptr(), self._numel[i])
        return t

    def state_dict(self):
        """The model's state_dict with the engine's values (frozen params and
        buffers as torch holds them)."""
        return self.module.state_dict()

    @ferry._one_thread
    def export_weights(self, path, max_shard_bytes=0):
        """ferry_export_weights: the engine's params as safetensors. It holds
        the trainable params only: refused when the model has frozen ones
        (save model.state_dict(), or save_pretrained, which hold all)."""
        frozen = [n for n, p in self.module.named_parameters() if id(p) not in self._pid]
        if frozen:
            raise ferry.Error(ferry.EINVAL, "the engine holds the trainable "
                              "params only, and %d frozen ones (%s) would be left out; save "
                              "model.state_dict() (or save_pretrained) instead"
                              % (len(frozen), ", ".join(frozen[:3])), "export_weights")
        self._release_all()
        self.engine.export_weights(path, max_shard_bytes)

    def named_parameters(self):
        return list(zip(self._names, self._p))

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @ferry._one_thread
    def close(self, restore=True):
        """Removes the hooks; with restore, each param gets its master values
        (in the compute dtype) as ordinary torch storage."""
        if self.engine is None:
            return
        self._release_all()
        for h in self._handles:
            h.remove()
        self._handles, self._acc = [], []
        for i, p in enumerate(self._p):
            if restore:
                p.data = self.read_param(self._names[i]).to(self.device, self.compute_dtype)
        self.stream.close()
        self.engine.close()
        self.engine = None


def initialize(model, config, groups=None, compute_dtype=None):
    """Moves model's trainable parameters into a ferry engine built from config
    (a ferry.Config, a dict of dotted keys, or a .cfg path) and returns the
    TorchEngine that trains it. groups: None (one per child of the largest
    nn.ModuleList, one before, one after) or a list of module-name prefixes.
    Frozen parameters (requires_grad False) stay torch's. compute_dtype: the
    dtype the model computes in (default: precision.params; fp32 for fp16
    params on the host backend, which CPU torch cannot compute in). Ctrl-C
    during the engine's set-up (on the main thread, Python's own SIGINT
    handler in place) stops it at the engine's next ask and raises
    KeyboardInterrupt, the engine and its swap files released."""
    return TorchEngine(model, config, groups=groups, compute_dtype=compute_dtype)
