/* tests/gpt/cuda_emu/runtime.cpp — the CUDA runtime of the emulated build
 * (cuda_runtime.h): device allocations are mmap'd host memory between two
 * inaccessible guard pages (the data ends 256-aligned against the upper
 * one), filled with 0xff (NaN in fp32 and bf16) so reads of what nothing
 * wrote show, and inaccessible to host code but while the "device" runs
 * (a kernel, a copy, a GEMM); pinned host memory is malloc'd or registered
 * and tracked.
 * Streams are queues run as late as CUDA allows: an asynchronous copy,
 * set, launch or GEMM waits in its stream's queue until something must
 * see its result (a stream, event or device synchronize, a copy to or from
 * pageable memory, which CUDA makes synchronous, cudaFree); so a host read
 * of pinned memory, or a write to it, that misses its wait sees the wrong
 * bytes, as it could on a GPU. The legacy default stream (0) runs at once
 * after the blocking streams; non-blocking streams never wait for it. Use
 * of a destroyed stream or event aborts. One host thread only. */
#include "cuda_runtime.h"

#include <deque>
#include <functional>
#include <map>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

struct CUstream_st {
  std::deque<std::function<void()>> q;
  unsigned long long queued, done; /* ops ever enqueued, ever run */
  int nonblocking;
};
struct CUevent_st {
  cudaStream_t s; /* where last recorded (0: complete) */
  unsigned long long seq;
};

namespace {

struct region {
  size_t size; /* bytes asked */
  void *map;   /* the mapping (device) or NULL (pinned host) */
  size_t map_len;
  int owned; /* pinned: cudaHostAlloc'd (else registered) */
};
std::map<uintptr_t, region> device, pinned;
std::map<void *, int> streams, events; /* live */

[[noreturn]] void die(const char *what, const char *why) {
  fprintf(stderr, "cuda emulation: %s: %s\n", what, why);
  abort();
}

/* the region of m holding [p, p + n), or NULL */
const region *find(const std::map<uintptr_t, region> &m, const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return NULL;
  --it;
  if (a - it->first >= it->second.size || n > it->second.size - (a - it->first)) return NULL;
  return &it->second;
}

int is_host(const void *p) { return !find(device, p, 1); }

size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Device memory is readable only while the "device" runs (an op, a
 * synchronous copy): host code that dereferences a device pointer faults,
 * as on a GPU. Nested windows count. */
int window;
void device_open(void) {
  if (window++) return;
  for (auto &e : device)
    mprotect((char *)e.second.map + page(), e.second.map_len - 2 * page(), PROT_READ | PROT_WRITE);
}
void device_close(void) {
  if (--window) return;
  for (auto &e : device)
    mprotect((char *)e.second.map + page(), e.second.map_len - 2 * page(), PROT_NONE);
}
/* f run as the device */
template <typename F> void on_device(F f) {
  device_open();
  f();
  device_close();
}

/* A fault in a device mapping: say which kind, then die as the fault would */
void on_fault(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  uintptr_t a = (uintptr_t)si->si_addr;
  for (auto &e : device) {
    uintptr_t m = (uintptr_t)e.second.map;
    if (a < m || a >= m + e.second.map_len) continue;
    const char *why = a < m + page() || a >= m + e.second.map_len - page()
                          ? "cuda emulation: an access just outside a device allocation\n"
                          : "cuda emulation: host code dereferenced device memory\n";
    ssize_t r = write(2, why, strlen(why));
    (void)r;
    break;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
void catch_faults(void) {
  static int done;
  if (done++) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
}

/* runs s's ops until `upto` of them ever have */
void drain(cudaStream_t s, unsigned long long upto) {
  if (s->done >= upto || s->q.empty()) return;
  device_open();
  while (s->done < upto && !s->q.empty()) {
    std::function<void()> op = std::move(s->q.front());
    s->q.pop_front();
    op();
    s->done++;
  }
  device_close();
}
void drain_all(int blocking_only) {
  for (auto &e : streams) {
    cudaStream_t s = (cudaStream_t)e.first;
    if (!blocking_only || !s->nonblocking) drain(s, s->queued);
  }
}

} // namespace

/* op in stream order: queued on s, or at once on the legacy stream */
void emu_enqueue(cudaStream_t s, std::function<void()> op) {
  emu_check_stream(s, "an asynchronous call");
  if (!s) {
    drain_all(1);
    on_device(op);
    return;
  }
  s->q.push_back(std::move(op));
  s->queued++;
}

extern "C" {

int emu_is_device(const void *p, size_t n) { return find(device, p, n ? n : 1) != NULL; }
void emu_check_device(const void *p, size_t n, const char *what) {
  if (!emu_is_device(p, n)) {
    char why[160];
    snprintf(why, sizeof why, "%p (+%zu bytes) is not in one device allocation%s", p, n,
             find(pinned, p, 1) ? " (it is pinned host memory)" : "");
    die(what, why);
  }
}
void emu_check_stream(cudaStream_t s, const char *what) {
  if (s && !streams.count((void *)s)) die(what, "a stream not created or already destroyed");
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  emu_check_stream(st, "cudaStreamSynchronize");
  if (st)
    drain(st, st->queued);
  else
    drain_all(1);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  drain_all(0);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  catch_faults();
  size_t pg = page(), body = ((n ? n : 1) + 255) & ~(size_t)255;
  size_t len = (body + pg - 1) / pg * pg + 2 * pg;
  char *m = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return *p = NULL, cudaErrorMemoryAllocation;
  mprotect(m, pg, PROT_NONE), mprotect(m + len - pg, pg, PROT_NONE);
  char *at = m + len - pg - body;
  memset(at, 0xff, body);
  if (!window) mprotect(m + pg, len - 2 * pg, PROT_NONE);
  device[(uintptr_t)at] = region{n ? n : 1, m, len, 0};
  *p = at;
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  drain_all(0); /* as CUDA, which synchronizes the device */
  auto it = device.find((uintptr_t)p);
  if (it == device.end()) die("cudaFree", "not a device allocation's start");
  munmap(it->second.map, it->second.map_len);
  device.erase(it);
  return cudaSuccess;
}

static void add_pinned(void *p, size_t n, int owned, const char *what) {
  if (find(pinned, p, 1) || find(pinned, (char *)p + n - 1, 1)) die(what, "already pinned");
  pinned[(uintptr_t)p] = region{n, NULL, 0, owned};
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  *p = malloc(n ? n : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  memset(*p, 0xff, n ? n : 1);
  add_pinned(*p, n ? n : 1, 1, "cudaHostAlloc");
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  auto it = pinned.find((uintptr_t)p);
  if (it == pinned.end() || !it->second.owned) die("cudaFreeHost", "not a cudaHostAlloc'd block");
  drain_all(0);
  pinned.erase(it);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
  (void)flags;
  if (!p || !n || !is_host(p)) die("cudaHostRegister", "not host memory");
  add_pinned(p, n, 0, "cudaHostRegister");
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
  auto it = pinned.find((uintptr_t)p);
  if (it == pinned.end() || it->second.owned) die("cudaHostUnregister", "not registered");
  drain_all(0);
  pinned.erase(it);
  return cudaSuccess;
}

/* the ends of a copy as its kind says they are */
static void check_copy(void *d, const void *s, size_t n, int kind, const char *what) {
  if (!n) return;
  int dd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
  int sd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
  if (kind == cudaMemcpyDefault) {
    if (!emu_is_device(d, n) && !is_host(d)) die(what, "destination straddles device memory");
    if (!emu_is_device(s, n) && !is_host(s)) die(what, "source straddles device memory");
    return;
  }
  if (kind == cudaMemcpyHostToHost) dd = sd = 0;
  if (dd)
    emu_check_device(d, n, what);
  else if (!is_host(d))
    die(what, "the destination is device memory, the kind says host");
  if (sd)
    emu_check_device(s, n, what);
  else if (!is_host(s))
    die(what, "the source is device memory, the kind says host");
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int kind) {
  check_copy(d, s, n, kind, "cudaMemcpy");
  drain_all(1);
  on_device([=] { memmove(d, s, n); });
  return cudaSuccess;
}
/* A copy from pageable memory takes the bytes at the call (CUDA stages
 * them), one into pageable memory is done on return (CUDA waits); pinned
 * and device ends are read and written when the stream gets there. */
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, cudaStream_t st) {
  emu_check_stream(st, "cudaMemcpyAsync");
  check_copy(d, s, n, kind, "cudaMemcpyAsync");
  if (!n) return cudaSuccess;
  if (is_host(d) && !find(pinned, d, n)) { /* into pageable memory */
    cudaStreamSynchronize(st);
    on_device([=] { memmove(d, s, n); });
  } else if (is_host(s) && !find(pinned, s, n)) { /* from pageable memory */
    std::vector<char> b((const char *)s, (const char *)s + n);
    emu_enqueue(st, [d, b] { memcpy(d, b.data(), b.size()); });
  } else {
    emu_enqueue(st, [d, s, n] { memmove(d, s, n); });
  }
  return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
  if (n) emu_check_device(d, n, "cudaMemset");
  drain_all(1);
  on_device([=] { memset(d, v, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
  emu_check_stream(st, "cudaMemsetAsync");
  if (n) emu_check_device(d, n, "cudaMemsetAsync");
  emu_enqueue(st, [d, v, n] { memset(d, v, n); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *st) { return cudaStreamCreateWithFlags(st, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned flags) {
  *st = new CUstream_st();
  (*st)->nonblocking = (flags & cudaStreamNonBlocking) != 0;
  streams[(void *)*st] = 1;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t st) {
  if (!st || !streams.count((void *)st)) die("cudaStreamDestroy", "not a live stream");
  drain(st, st->queued); /* its work still completes */
  streams.erase((void *)st);
  delete st;
  return cudaSuccess;
}
static void check_event(cudaEvent_t ev, const char *what) {
  if (!events.count((void *)ev)) die(what, "an event not created or already destroyed");
  if (ev->s && !streams.count((void *)ev->s)) ev->s = NULL; /* its stream completed it */
}
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned flags) {
  (void)flags;
  check_event(ev, "cudaStreamWaitEvent");
  cudaStream_t s = ev->s;
  unsigned long long seq = ev->seq;
  if (s && s != st) emu_enqueue(st, [s, seq] { drain(s, seq); });
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
  (void)flags;
  *ev = new CUevent_st();
  events[(void *)*ev] = 1;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  check_event(ev, "cudaEventDestroy");
  events.erase((void *)ev);
  delete ev;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
  check_event(ev, "cudaEventRecord");
  emu_check_stream(st, "cudaEventRecord");
  if (st)
    ev->s = st, ev->seq = st->queued;
  else
    drain_all(1), ev->s = NULL;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  check_event(ev, "cudaEventSynchronize");
  if (ev->s) drain(ev->s, ev->seq);
  return cudaSuccess;
}
/* a query completes what it asks about: pollers see progress */
cudaError_t cudaEventQuery(cudaEvent_t ev) { return cudaEventSynchronize(ev); }
/* errors abort where they happen: none is ever pending */
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess                 ? "no error"
         : e == cudaErrorMemoryAllocation ? "out of memory (emulated)"
                                          : "invalid value (emulated)";
}

} /* extern "C" */
