/* tests/memory/test_mem_streams.c — a device copy held on several streams at
 * once, on the host backend: the next load into its space and its
 * write-back wait for the slow stream's work even when a fast stream
 * released it last, also with more streams than a chunk tracks apart; the
 * on_copy hook launches nothing while it is switched off; a copy still
 * loading is evicted without a host wait, its H2D still reading the host
 * copy, which a host write waits for; and a prefetch never evicts a copy
 * the trace needs before its own.
 */
#include "device/probes.h"
#include "memory/mem_impl.h"
#include "tests/test.h"

#include <stdatomic.h>
#include <string.h>

#define CHUNK 4096
#define NSTREAMS 6

static ferry_device *dev;
static ferry_stream *st[NSTREAMS];

/* `groups` groups of one chunk each, group g's host bytes 0x11 * (g + 1). */
static ferry_mem *make_n(void (*on_copy)(void *, int, int), void *user, int groups,
                         size_t dev_chunks) {
  ferry_mem_config c = ferry_mem_config_default();
  c.dev = dev;
  c.budget[FERRY_TIER_DEVICE] = dev_chunks * CHUNK;
  c.budget[FERRY_TIER_HOST] = 1 << 20;
  c.chunk_size = CHUNK;
  c.host_pinned = 0;
  c.numa_local = 0;
  c.on_copy = on_copy;
  c.copy_user = user;
  ferry_mem *m = NULL;
  REQUIRE(ferry_mem_create(&c, &m) == 0);
  int64_t n = CHUNK / 2;
  for (int g = 0; g < groups; g++) {
    char name[8] = {(char)('a' + g), 0};
    REQUIRE(ferry_mem_register(m, name, FERRY_DT_F16, 1, &n, (uint32_t)g, FERRY_ROLE_PARAM,
                               NULL) == 0);
  }
  REQUIRE(ferry_mem_finalize(m) == 0);
  for (uint32_t id = 0; id < (uint32_t)groups; id++) {
    void *h = NULL;
    REQUIRE(ferry_mem_tensor_ptr(m, id, FERRY_TIER_HOST, &h) == 0);
    memset(h, 0x11 * (int)(id + 1), CHUNK); /* a: 0x11, b: 0x22 */
  }
  return m;
}

/* a and b, one chunk of device room: a second fetch evicts the first. */
static ferry_mem *make(void (*on_copy)(void *, int, int), void *user) {
  return make_n(on_copy, user, 2, 1);
}

static int all_bytes(const void *p, int v) {
  const unsigned char *b = p;
  for (size_t i = 0; i < CHUNK; i++)
    if (b[i] != (unsigned char)v) return 0;
  return 1;
}

/* An emulated kernel of the slow stream: reads or writes the device copy. */
typedef struct {
  unsigned char *p;
  int write;           /* write `value`, else check the bytes are `value` */
  int value;
  atomic_int done, ok;
} slow_work;

static int slow_fn(void *arg) {
  slow_work *w = arg;
  if (w->write) memset(w->p, w->value, CHUNK);
  atomic_store(&w->ok, w->write || all_bytes(w->p, w->value));
  atomic_store(&w->done, 1);
  return 0;
}

/* Streams 0..k-1 hold group 0 on the device; stream 0 sleeps, then runs w
 * (marking the copy dirty first when w writes); all release, stream 0
 * first, so a fast stream records the last use. */
static void hold_and_release(ferry_mem *m, int k, slow_work *w) {
  for (int i = 0; i < k; i++)
    REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[i], 0) == 0);
  void *d = NULL;
  REQUIRE(ferry_mem_tensor_ptr(m, 0, FERRY_TIER_DEVICE, &d) == 0);
  w->p = d;
  REQUIRE(ferry_stream_sleep(st[0], 0.3) == 0);
  REQUIRE(ferry_launch_host_func(st[0], slow_fn, w) == 0);
  if (w->write)
    REQUIRE(ferry_mem_mark_dirty(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[0]) == 0);
  for (int i = 0; i < k; i++)
    REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[i]) == 0);
}

/* The load of group 1 into group 0's space waits for the slow reader. */
static void test_reload_waits(void) {
  ferry_mem *m = make(NULL, NULL);
  slow_work w = {.write = 0, .value = 0x11};
  hold_and_release(m, 2, &w);
  /* stream NULL: returns once group 1's bytes are on the device */
  REQUIRE(ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0) == 0);
  EXPECT(atomic_load(&w.done) == 1); /* the load came after the slow read */
  for (int i = 0; i < NSTREAMS; i++) REQUIRE(ferry_stream_synchronize(st[i]) == 0);
  EXPECT(atomic_load(&w.ok) == 1); /* ... which saw group 0's bytes, not group 1's */
  void *d = NULL;
  REQUIRE(ferry_mem_tensor_ptr(m, 1, FERRY_TIER_DEVICE, &d) == 0);
  EXPECT(all_bytes(d, 0x22));
  REQUIRE(ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  ferry_mem_destroy(m);
}

/* The write-back of the dirty copy waits for the slow writer, with two
 * streams and with more than the chunk tracks apart. */
static void test_writeback_waits(int k) {
  ferry_mem *m = make(NULL, NULL);
  slow_work w = {.write = 1, .value = 0x33 + k};
  hold_and_release(m, k, &w);
  REQUIRE(ferry_mem_evict(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE) == 0);
  EXPECT(atomic_load(&w.done) == 1);
  void *h = NULL;
  REQUIRE(ferry_mem_tensor_ptr(m, 0, FERRY_TIER_HOST, &h) == 0);
  if (!all_bytes(h, 0x33 + k)) fprintf(stderr, "write-back with %d streams: torn\n", k);
  EXPECT(all_bytes(h, 0x33 + k));
  for (int i = 0; i < NSTREAMS; i++) REQUIRE(ferry_stream_synchronize(st[i]) == 0);
  ferry_mem_destroy(m);
}

static atomic_int hook_calls;
static void count_copy(void *user, int dir, int begin) {
  (void)user;
  (void)dir;
  (void)begin;
  atomic_fetch_add(&hook_calls, 1);
}

/* Off: moves launch no host function; on: each copy is bracketed. */
static void test_copy_hook(void) {
  ferry_mem *m = make(NULL, NULL);
  EXPECT(ferry_mem_copy_hook(m, 1) == FERRY_ESTATE); /* nothing to call */
  EXPECT(ferry_mem_copy_hook(m, 0) == 0);
  ferry_mem_destroy(m);

  m = make(count_copy, NULL);
  EXPECT(ferry_mem_copy_hook(m, 0) == 0);
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0) == 0);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  REQUIRE(ferry_mem_flush(m) == 0);
  EXPECT(atomic_load(&hook_calls) == 0);
  EXPECT(ferry_mem_copy_hook(m, 1) == 0);
  REQUIRE(ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0) == 0);
  REQUIRE(ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  ferry_mem_destroy(m); /* drains the copy streams */
  EXPECT(atomic_load(&hook_calls) == 2); /* one H2D: begin and end */
}

/* Group 0's H2D takes H2D_S (a slow link). Held on st[0] by a reader and
 * released, it still loads when group 1's fetch needs its space: the
 * fetch evicts it without waiting, in stream order (the reader still sees
 * group 0's bytes, group 1's load lands after). A host write of group 0
 * meanwhile waits for that H2D, which reads the host copy. The H2D is
 * long beside the fetch's bound (a fetch that waited for it takes about
 * H2D_S), so a loaded machine's stalls do not reach the bound. */
#define H2D_S 1.5
static void test_evict_loading(void) {
  ferry_mem *m = make(NULL, NULL);
  REQUIRE(ferry_device_host_copy_rate(dev, 0, H2D_S) == 0);
  slow_work w = {.write = 0, .value = 0x11};
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[0], 0) == 0);
  void *d = NULL;
  REQUIRE(ferry_mem_tensor_ptr(m, 0, FERRY_TIER_DEVICE, &d) == 0);
  w.p = d;
  REQUIRE(ferry_launch_host_func(st[0], slow_fn, &w) == 0);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[0]) == 0);
  uint64_t waits = ferry_device_host_waits();
  double t0 = ferry_now();
  REQUIRE(ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[1], 0) == 0);
  double took = ferry_now() - t0;
  EXPECT(ferry_device_host_waits() == waits);
  EXPECT(took < H2D_S / 2); /* not after group 0's H2D */
  ferry_mem_chunk_info ci;
  REQUIRE(ferry_mem_chunk_get(m, 0, &ci) == 0);
  EXPECT(ci.state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT);
  /* the host copy under the H2D still in flight: the write waits for it */
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  REQUIRE(ferry_mem_mark_dirty(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  void *h = NULL;
  REQUIRE(ferry_mem_tensor_ptr(m, 0, FERRY_TIER_HOST, &h) == 0);
  memset(h, 0x44, CHUNK);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  for (int i = 0; i < NSTREAMS; i++) REQUIRE(ferry_stream_synchronize(st[i]) == 0);
  EXPECT(atomic_load(&w.done) == 1 && atomic_load(&w.ok) == 1); /* group 0's old bytes */
  REQUIRE(ferry_mem_tensor_ptr(m, 1, FERRY_TIER_DEVICE, &d) == 0);
  EXPECT(all_bytes(d, 0x22));
  REQUIRE(ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  printf("a loading copy evicted in %.3f s (its H2D %.1f s), no host wait\n", took, H2D_S);
  ferry_mem_destroy(m);
  REQUIRE(ferry_device_host_copy_rate(dev, 0, 0) == 0);
}

/* Trace 0, 1, 2; device room for two groups. Group 0 held, group 1
 * prefetched: a prefetch of group 2 would evict group 1, needed first,
 * so it is refused and group 1 stays. */
static void test_prefetch_keeps_sooner(void) {
  ferry_mem *m = make_n(NULL, NULL, 3, 2);
  const uint32_t groups[3] = {0, 1, 2};
  const int fams[3] = {FERRY_FAMILY_PARAMS, FERRY_FAMILY_PARAMS, FERRY_FAMILY_PARAMS};
  REQUIRE(ferry_mem_trace_set(m, groups, fams, 3) == 0);
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[0], 0) == 0);
  REQUIRE(ferry_mem_prefetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE) == 0);
  EXPECT(ferry_mem_prefetch(m, 2, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE) == FERRY_ENOMEM);
  ferry_mem_chunk_info ci;
  REQUIRE(ferry_mem_chunk_get(m, 1, &ci) == 0);
  EXPECT(ci.state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT);
  REQUIRE(ferry_mem_chunk_get(m, 2, &ci) == 0);
  EXPECT(ci.state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, st[0]) == 0);
  REQUIRE(ferry_stream_synchronize(st[0]) == 0);
  ferry_mem_destroy(m);
}

int main(void) {
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 1 << 20;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  for (int i = 0; i < NSTREAMS; i++) REQUIRE(ferry_stream_create(dev, &st[i]) == 0);
  test_reload_waits();
  test_writeback_waits(2);
  test_writeback_waits(NSTREAMS); /* more than MEM_USE_STREAMS */
  test_copy_hook();
  test_evict_loading();
  test_prefetch_keeps_sooner();
  ferry_device_destroy(dev);
  return test_finish("test_mem_streams");
}
