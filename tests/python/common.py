"""tests/python/common.py: what the Python tests share: the skip rule (no torch:
exit 77 with a message), the device they run on, the small model (embeddings,
a ModuleList of LayerNorm-Linear-GELU blocks, a head), batches, a reference
AdamW run and engine configurations with a swap dir under the build tree.

FERRY_PY_DEVICE selects the device: "host" (the default: the host backend,
CPU torch) or "cuda" (tools/gpu_check.sh's python part): the engines get
device = "cuda" with a pinned host pool (the cuda backend refuses a pageable
one), the models and batches are made on torch's current CUDA device, and
torch runs deterministically (the tests compare losses bit for bit)."""
import atexit
import os
import shutil
import sys
import tempfile

from checks import fail  # noqa: F401 (the tests import it from here)

SKIP = 77


def need_torch():
    if os.environ.get("FERRY_SANITIZE"):
        print("skip: a sanitizer build's libferry.so cannot be loaded into python")
        sys.exit(SKIP)
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("skip: torch is not importable by %s (%s): apt-get install python3-torch"
              % (sys.executable, e))
        sys.exit(SKIP)


DEVICE = os.environ.get("FERRY_PY_DEVICE") or "host"
if DEVICE not in ("host", "cuda"):
    print("FAIL: FERRY_PY_DEVICE=%s: expected host or cuda" % DEVICE)
    sys.exit(1)
if DEVICE == "cuda":
    # cuBLAS is deterministic only with a fixed workspace (set before CUDA starts)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
need_torch()
import torch  # noqa: E402
import torch.utils.checkpoint  # noqa: E402,F401
from torch import nn  # noqa: E402

if DEVICE == "cuda":
    if not torch.cuda.is_available():
        # asked for explicitly: a failure, not a skip (gpu_check.sh skips first)
        print("FAIL: FERRY_PY_DEVICE=cuda but torch %s in %s sees no GPU "
              "(torch.cuda.is_available() is false)" % (torch.__version__, sys.executable))
        sys.exit(1)
    torch.use_deterministic_algorithms(True, warn_only=True)  # a warning names any other op
    TORCH_DEVICE = torch.device("cuda", torch.cuda.current_device())
else:
    TORCH_DEVICE = torch.device("cpu")

VOCAB, DIM, LAYERS, SEQ, BATCH = 64, 32, 4, 8, 4
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.01


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.proj(self.act(self.fc(self.ln(x))))


class Net(nn.Module):
    def __init__(self, vocab=VOCAB, d=DIM, layers=LAYERS, ckpt=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.ckpt = ckpt

    def forward(self, idx):
        x = self.emb(idx) + self.pos
        for b in self.blocks:
            if self.ckpt:  # True: reentrant (1.13's default); "nonreentrant"
                x = torch.utils.checkpoint.checkpoint(
                    b, x, use_reentrant=self.ckpt != "nonreentrant")
            else:
                x = b(x)
        return self.head(self.ln_f(x))


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw).to(TORCH_DEVICE)


def batches(n, seed=1):
    """Sequences start, start+s, start+2s, ... (mod VOCAB): learnable."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 4, (BATCH, 1), generator=g)
        idx = (start + stride * torch.arange(SEQ + 1)) % VOCAB
        out.append((idx[:, :-1].to(TORCH_DEVICE), idx[:, 1:].to(TORCH_DEVICE)))
    return out


def loss_of(logits, y):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                       y.reshape(-1))


def torch_losses(model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    out = []
    for x, y in data:
        loss = loss_of(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def work_dir(name):
    """A fresh folder under FERRY_TEST_TMP (the build tree), removed at exit."""
    base = os.environ.get("FERRY_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix=name + "-", dir=base)
    atexit.register(shutil.rmtree, d, True)
    return d


def config(**over):
    """Params on the host, optimizer on NVMe (a swap dir under the build tree);
    on cuda (FERRY_PY_DEVICE) the device tier is the GPU's, the host pool pinned."""
    swap = work_dir("swap")
    c = {"device": DEVICE, "tiers.gpu.budget": "4M", "tiers.host.budget": "64M",
         "tiers.host.pinned": DEVICE == "cuda", "chunk_size": "64K", "placement.params": "host",
         "placement.optimizer": "nvme", "tiers.nvme.paths": [swap],
         "precision.params": "fp32", "optimizer.type": "adamw", "optimizer.lr": LR,
         "optimizer.betas": list(BETAS), "optimizer.eps": EPS, "optimizer.weight_decay": WD,
         "clip_grad_norm": 0, "optimizer.threads": 1}
    c.update(over)
    return c


def ferry_losses(eng, data):
    out = []
    for x, y in data:
        loss = loss_of(eng(x), y)
        eng.backward(loss)
        eng.step()
        out.append(loss.item())
    return out


def check_budget(eng):
    """The device tier's peak within its budget; returns the device tier's stats."""
    d = eng.stats()["tiers"]["device"]
    if not 0 < d["peak"] <= d["budget"]:
        fail("device tier peak %d bytes, budget %d" % (d["peak"], d["budget"]))
    return d


def close_rel(a, b, tol):
    return all(abs(x - y) <= tol * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b)) \
        and len(a) == len(b)
