"""tools/gpucheck_rehearse.py — the GPU check's rehearsal (gpu_check.sh
--rehearse), on a machine without a GPU: every part runs as it does on the
GPU machine, the bundle's real programs with their real arguments, until
the first program that needs the GPU finds none (exit 77, or the engine's
FERRY_ENODEV); that part then ends as a skip naming the program and what it
said, and the check goes on with the next part. A fault on the way (a path,
a file missing from the bundle, an argument a program refuses, a Python
import) is a fail, as it would be there. The parts' CPU-only work keeps its
commands but not its sizes where they are too large for a small machine
(SIZES), and the plans are made against the GPU machine's RAM.
"""
import re
import shlex

# Set by gpucheck.Check when --rehearse is given.
ON = False
# What the bundle's programs say when there is no GPU (ferry-cuda-peak and
# the CUDA tests exit 77; the engine's device create fails FERRY_ENODEV).
NO_GPU_RE = re.compile(r"FERRY_ENODEV|no usable CUDA|cudaErrorNoDevice|cudaErrorInsufficientDriver|"
                       r"no CUDA-capable device|CUDA driver version is insufficient")
# The GPU machine's RAM (the 13b and peers parts plan and choose their runs
# against it) and the sizes of the CPU-only work in a rehearsal.
GPU_HOST_RAM = 128 << 30
SIZES = {"adam_params": "4M", "adam_steps": 2, "profile_adam_params": "4M"}


class NeedsGpu(Exception):
    """A program of the bundle found no GPU: the part has reached the GPU."""

    def __init__(self, command, said):
        Exception.__init__(self, said)
        self.command, self.said = command, said
        self.figures = None  # the part's figures so far, where it adds them
        self.failed = []  # what failed in the part before it reached the GPU


def stop_if_no_gpu(cmd, rc, output):
    """In a rehearsal: raises NeedsGpu when cmd (exit rc, its output) found no GPU."""
    if not ON or rc in (0, None):
        return
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    said = next((ln for ln in reversed(lines) if NO_GPU_RE.search(ln)), None)
    if said and len(said) > 300:  # (a JSON line holding a child's output) the words around it
        m = NO_GPU_RE.search(said)
        said = "..." + said[max(m.start() - 200, 0):m.end() + 60]
    if rc == 77 or said:
        raise NeedsGpu(shlex.join(cmd), (said or (lines[-1] if lines else "exit 77"))[:300])


def size(name, normal):
    """A size of the CPU-only work: SIZES[name] in a rehearsal, else normal."""
    return SIZES[name] if ON else normal


def reached(res, name, e, wall_s):
    """Records part name as the skip a rehearsal expects: it reached the GPU."""
    words = [w.rsplit("/", 1)[-1] for w in shlex.split(e.command)] or ["?"]
    prog = " ".join(words[:2]) if words[0].startswith("python") else words[0]
    fig = dict(e.figures or res.data["parts"].get(name, {}).get("figures") or {})
    fig.update(rehearsal=True, stopped_at=e.command, said=e.said)
    why = "reached the GPU: %s found none (%s)" % (prog, e.said)
    if e.failed:  # a fault before the GPU is the rehearsal's finding: a fail
        res.part(name, "fail", e.command, wall_s, fig,
                 reason="rehearsal: %s; then %s" % ("; ".join(e.failed), why))
    else:
        res.part(name, "skip", e.command, wall_s, fig, reason="rehearsal: " + why)


def selftest():
    global ON
    was, ON = ON, True
    try:
        stop_if_no_gpu(["ferry", "plan"], 1, "ferry plan: bad option")  # not the GPU: no raise
        stop_if_no_gpu(["x"], 0, "FERRY_ENODEV")  # it ran: no raise
        for rc, out in ((77, "ferry-cuda-peak: skip: no usable CUDA device 0"),
                        (1, "engine create: device create: cuda backend: no usable CUDA driver "
                            "or device (FERRY_ENODEV)\nferry-gpt: exiting")):
            try:
                stop_if_no_gpu(["/b/bin/p", "--x"], rc, out)
                raise AssertionError("no NeedsGpu for %r" % out)
            except NeedsGpu as e:
                assert e.command == "/b/bin/p --x" and "usable CUDA" in e.said, e.said
        try:
            stop_if_no_gpu(["p"], 1, '{"error": "%s (FERRY_ENODEV)%s"}' % ("x" * 400, "y" * 400))
        except NeedsGpu as e:
            assert e.said.startswith("...x") and "(FERRY_ENODEV)yyy" in e.said, e.said
            assert len(e.said) < 300, len(e.said)
        assert size("adam_params", "256M") == "4M"

        class Res:  # gpucheck.Results' part(), recorded
            data = {"parts": {"x": {"figures": {"plan": 1}}}}

            def part(self, name, status, command, wall_s, fig, reason):
                self.got = (name, status, fig, reason)
        e, r = NeedsGpu("/b/bin/ferry-gpt train", "no usable CUDA"), Res()
        reached(r, "x", e, 1.0)
        assert r.got[1] == "skip" and r.got[2]["plan"] == 1 and r.got[2]["rehearsal"], r.got
        assert r.got[3] == "rehearsal: reached the GPU: ferry-gpt found none (no usable CUDA)"
        e.failed = ["run 1 not run: ferry plan failed"]  # a fault first: the part fails
        reached(r, "x", e, 1.0)
        assert r.got[1] == "fail" and r.got[3].startswith("rehearsal: run 1 not run"), r.got
    finally:
        ON = was
    assert size("adam_params", "256M") == "256M"
