/* tests/device/test_backend.c — the device backend conformance suite, run
 * once per backend: `test_backend host` and `test_backend cuda` (exit 77
 * without a CUDA device). Capacity enforcement, copies of 0, 1, odd,
 * unaligned and 1 GiB sizes, event ordering across streams, 64 concurrent
 * streams, destroy with work in flight, host functions and their errors,
 * sleeps that use no CPU, and bad arguments rejected with a status.
 */
#include "ferry.h"
#include "tests/device/backend_arg.h"
#include "tests/test.h"

#include <string.h>
#include <time.h>

static ferry_device_kind kind;

static ferry_device *make(size_t capacity) {
  ferry_device_config c = ferry_device_config_default();
  c.kind = kind;
  c.capacity = capacity;
  ferry_device *d = NULL;
  int rc = ferry_device_create(&c, &d);
  if (rc) fprintf(stderr, "device create: %s: %s\n", ferry_strerror(rc), ferry_last_error());
  REQUIRE(rc == 0 && d);
  return d;
}

static void fill(unsigned char *p, size_t n, unsigned long long seed) {
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0) test_rand(&seed);
    p[i] = (unsigned char)(seed >> ((i & 7) * 8));
  }
}

static void test_capacity(void) {
  ferry_device *d = make(1 << 20);
  void *a = NULL, *b = NULL;
  EXPECT(ferry_device_alloc(d, 1 << 20, &a) == 0 && a);
  EXPECT(((uintptr_t)a & 255) == 0);
  EXPECT(ferry_device_alloc(d, 1, &b) == FERRY_ENOMEM && b == NULL);
  EXPECT(strstr(ferry_device_last_error(d), "1 bytes") != NULL);
  ferry_device_info info;
  EXPECT(ferry_device_get_info(d, &info) == 0);
  EXPECT(info.capacity == 1 << 20 && info.used == 1 << 20 && info.peak == 1 << 20);
  EXPECT(ferry_device_free(d, a) == 0);
  /* many small allocations never exceed the cap */
  size_t got = 0;
  void *ptrs[5000];
  int n = 0;
  while (n < 5000 && ferry_device_alloc(d, 1000, &ptrs[n]) == 0) {
    got += 1024; /* 1000 rounded up to 256 */
    n++;
  }
  EXPECT(got <= (1 << 20) && n == 1024);
  for (int i = 0; i < n; i++) EXPECT(ferry_device_free(d, ptrs[i]) == 0);
  EXPECT(ferry_device_get_info(d, &info) == 0 && info.used == 0);
  EXPECT(ferry_device_alloc(d, (size_t)1 << 21, &a) == FERRY_ENOMEM);
  ferry_device_destroy(d);
}

/* H2D, D2D, D2H of `n` bytes at host/device offsets, compared. */
static void roundtrip(ferry_device *d, ferry_stream *s, size_t n, size_t hoff, size_t doff) {
  unsigned char *h1 = NULL, *h2 = NULL;
  void *d1 = NULL, *d2 = NULL;
  REQUIRE(ferry_host_alloc(d, n + hoff + 1, (void **)&h1) == 0);
  REQUIRE(ferry_host_alloc(d, n + hoff + 1, (void **)&h2) == 0);
  REQUIRE(ferry_device_alloc(d, n + doff + 1, &d1) == 0);
  REQUIRE(ferry_device_alloc(d, n + doff + 1, &d2) == 0);
  fill(h1 + hoff, n, n * 31 + hoff);
  memset(h2, 0xee, n + hoff + 1);
  EXPECT(ferry_memcpy_async(s, (char *)d1 + doff, h1 + hoff, n, FERRY_COPY_H2D) == 0);
  EXPECT(ferry_memcpy_async(s, (char *)d2 + doff, (char *)d1 + doff, n, FERRY_COPY_D2D) == 0);
  EXPECT(ferry_memcpy_async(s, h2 + hoff, (char *)d2 + doff, n, FERRY_COPY_D2H) == 0);
  EXPECT(ferry_stream_synchronize(s) == 0);
  if (n) EXPECT(memcmp(h1 + hoff, h2 + hoff, n) == 0);
  EXPECT(h2[n + hoff] == 0xee); /* nothing written past the end */
  EXPECT(ferry_device_free(d, d1) == 0 && ferry_device_free(d, d2) == 0);
  EXPECT(ferry_host_free(d, h1) == 0 && ferry_host_free(d, h2) == 0);
}

static void test_copies(void) {
  ferry_device *d = make((size_t)2200 << 20);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(d, &s) == 0);
  size_t sizes[] = {0, 1, 3, 255, 257, 4097, 12345, 1 << 20, (1 << 20) + 13};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    roundtrip(d, s, sizes[i], 0, 0);
    roundtrip(d, s, sizes[i], 3, 5); /* unaligned on both sides */
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* Sanitizers make every byte copied ~10x dearer: the plain build runs the
   * full 1 GiB, sanitizer builds 256 MiB. */
  roundtrip(d, s, (size_t)256 << 20, 0, 0);
#else
  roundtrip(d, s, (size_t)1 << 30, 0, 0); /* 1 GiB */
#endif
  /* memset */
  unsigned char *h;
  void *dv;
  REQUIRE(ferry_host_alloc(d, 1000, (void **)&h) == 0);
  REQUIRE(ferry_device_alloc(d, 1000, &dv) == 0);
  EXPECT(ferry_memset_async(s, dv, 0xab, 1000) == 0);
  EXPECT(ferry_memset_async(s, (char *)dv + 10, 0x01, 7) == 0);
  EXPECT(ferry_memcpy_async(s, h, dv, 1000, FERRY_COPY_D2H) == 0);
  EXPECT(ferry_stream_synchronize(s) == 0);
  int ok = 1;
  for (int i = 0; i < 1000; i++) ok &= h[i] == ((i >= 10 && i < 17) ? 0x01 : 0xab);
  EXPECT(ok);
  EXPECT(ferry_stream_destroy(s) == 0);
  ferry_device_destroy(d);
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static double wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_events(void) {
  ferry_device *d = make(16 << 20);
  ferry_stream *a, *b;
  ferry_event *e, *t0, *t1, *never;
  REQUIRE(ferry_stream_create(d, &a) == 0 && ferry_stream_create(d, &b) == 0);
  REQUIRE(ferry_event_create(d, &e) == 0 && ferry_event_create(d, &t0) == 0);
  REQUIRE(ferry_event_create(d, &t1) == 0 && ferry_event_create(d, &never) == 0);
  void *dv;
  unsigned char *h;
  REQUIRE(ferry_device_alloc(d, 4096, &dv) == 0);
  REQUIRE(ferry_host_alloc(d, 4096, (void **)&h) == 0);
  EXPECT(ferry_memset_async(a, dv, 0, 4096) == 0);
  EXPECT(ferry_stream_synchronize(a) == 0);
  /* a: sleep, then write 7s; b: waits for a's event, then reads. Without the
   * event b would read zeros. */
  double w0 = wall_seconds(), c0 = cpu_seconds();
  EXPECT(ferry_event_record(t0, a) == 0);
  EXPECT(ferry_stream_sleep(a, 0.2) == 0);
  EXPECT(ferry_memset_async(a, dv, 7, 4096) == 0);
  EXPECT(ferry_event_record(e, a) == 0);
  EXPECT(ferry_event_record(t1, a) == 0);
  EXPECT(ferry_event_query(e) == FERRY_EAGAIN);
  EXPECT(ferry_stream_query(a) == FERRY_EAGAIN);
  EXPECT(ferry_stream_wait_event(b, e) == 0);
  EXPECT(ferry_stream_wait_event(b, never) == 0); /* never recorded: no wait */
  EXPECT(ferry_memcpy_async(b, h, dv, 4096, FERRY_COPY_D2H) == 0);
  EXPECT(ferry_stream_synchronize(b) == 0);
  double w1 = wall_seconds(), c1 = cpu_seconds();
  int ok = 1;
  for (int i = 0; i < 4096; i++) ok &= h[i] == 7;
  EXPECT(ok);
  EXPECT(ferry_event_query(e) == 0);
  EXPECT(ferry_event_synchronize(t1) == 0);
  float ms = 0;
  EXPECT(ferry_event_elapsed_ms(t0, t1, &ms) == 0);
  EXPECT(ms >= 190.0f && ms < 2000.0f);
  EXPECT(w1 - w0 >= 0.19);
  /* the sleep stands for GPU work: it must not burn a core */
  EXPECT(c1 - c0 < 0.5 * (w1 - w0));
  EXPECT(ferry_event_elapsed_ms(t0, never, &ms) != 0); /* never recorded */
  EXPECT(ferry_event_query(never) == 0);
  EXPECT(ferry_event_synchronize(never) == 0);
  ferry_device_destroy(d);
}

enum { NSTREAMS = 64, PER = 64 << 10 };

static void test_many_streams(void) {
  ferry_device *d = make((size_t)NSTREAMS * PER * 2);
  ferry_stream *s[NSTREAMS];
  unsigned char *hin, *hout;
  unsigned char *dv;
  REQUIRE(ferry_host_alloc(d, (size_t)NSTREAMS * PER, (void **)&hin) == 0);
  REQUIRE(ferry_host_alloc(d, (size_t)NSTREAMS * PER, (void **)&hout) == 0);
  REQUIRE(ferry_device_alloc(d, (size_t)NSTREAMS * PER, (void **)&dv) == 0);
  fill(hin, (size_t)NSTREAMS * PER, 99);
  memset(hout, 0, (size_t)NSTREAMS * PER);
  for (int i = 0; i < NSTREAMS; i++) REQUIRE(ferry_stream_create(d, &s[i]) == 0);
  for (int round = 0; round < 4; round++)
    for (int i = 0; i < NSTREAMS; i++) {
      size_t o = (size_t)i * PER;
      EXPECT(ferry_memcpy_async(s[i], dv + o, hin + o, PER, FERRY_COPY_H2D) == 0);
      EXPECT(ferry_memcpy_async(s[i], hout + o, dv + o, PER, FERRY_COPY_D2H) == 0);
    }
  for (int i = 0; i < NSTREAMS; i++) EXPECT(ferry_stream_synchronize(s[i]) == 0);
  EXPECT(memcmp(hin, hout, (size_t)NSTREAMS * PER) == 0);
  for (int i = 0; i < NSTREAMS; i += 2) EXPECT(ferry_stream_destroy(s[i]) == 0);
  ferry_device_destroy(d); /* the odd ones die with the device */
}

static void test_destroy_in_flight(void) {
  ferry_device *d = make(64 << 20);
  ferry_stream *a, *b;
  ferry_event *e;
  REQUIRE(ferry_stream_create(d, &a) == 0 && ferry_stream_create(d, &b) == 0);
  REQUIRE(ferry_event_create(d, &e) == 0);
  void *dv;
  unsigned char *h;
  REQUIRE(ferry_device_alloc(d, 32 << 20, &dv) == 0);
  REQUIRE(ferry_host_alloc(d, 32 << 20, (void **)&h) == 0);
  memset(h, 1, 32 << 20);
  for (int i = 0; i < 8; i++) {
    EXPECT(ferry_memcpy_async(a, dv, h, 32 << 20, FERRY_COPY_H2D) == 0);
    EXPECT(ferry_stream_sleep(a, 0.005) == 0);
  }
  EXPECT(ferry_event_record(e, a) == 0);
  EXPECT(ferry_stream_wait_event(b, e) == 0);
  EXPECT(ferry_memcpy_async(b, h, dv, 32 << 20, FERRY_COPY_D2H) == 0);
  ferry_device_destroy(d); /* no synchronize: drains, frees, no crash or leak */
}

static int ran;
static int set_ran(void *arg) {
  ran = *(int *)arg;
  return 0;
}
static int fail_io(void *arg) {
  (void)arg;
  return FERRY_EIO;
}

static void test_host_funcs(void) {
  ferry_device *d = make(1 << 20);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(d, &s) == 0);
  int v = 42;
  EXPECT(ferry_stream_sleep(s, 0.02) == 0);
  EXPECT(ferry_launch_host_func(s, set_ran, &v) == 0);
  EXPECT(ferry_stream_synchronize(s) == 0);
  EXPECT(ran == 42);
  EXPECT(ferry_launch_host_func(s, fail_io, NULL) == 0);
  EXPECT(ferry_stream_synchronize(s) == FERRY_EIO);
  EXPECT(ferry_stream_synchronize(s) == 0); /* reported once */
  ferry_device_destroy(d);
}

static void test_bad_args(void) {
  ferry_device *d = make(1 << 20), *d2 = make(1 << 20);
  ferry_stream *s, *s2;
  ferry_event *e2;
  REQUIRE(ferry_stream_create(d, &s) == 0 && ferry_stream_create(d2, &s2) == 0);
  REQUIRE(ferry_event_create(d2, &e2) == 0);
  void *p = NULL, *hp = NULL;
  char stack[64];
  EXPECT(ferry_device_alloc(d, 16, NULL) == FERRY_EINVAL);
  EXPECT(ferry_device_alloc(NULL, 16, &p) == FERRY_EINVAL);
  REQUIRE(ferry_device_alloc(d, 1024, &p) == 0);
  EXPECT(ferry_device_free(d, p) == 0);
  EXPECT(ferry_device_free(d, p) == FERRY_EINVAL); /* double free */
  EXPECT(strlen(ferry_device_last_error(d)) > 0);
  EXPECT(ferry_device_free(d, stack) == FERRY_EINVAL); /* foreign */
  EXPECT(ferry_device_free(d, NULL) == 0);
  REQUIRE(ferry_device_alloc(d, 1024, &p) == 0);
  EXPECT(ferry_device_free(d, (char *)p + 256) == FERRY_EINVAL); /* inside a block */
  EXPECT(ferry_device_free(d2, p) == FERRY_EINVAL);               /* other device */
  REQUIRE(ferry_host_alloc(d, 100, &hp) == 0);
  EXPECT(ferry_host_free(d, stack) == FERRY_EINVAL);
  EXPECT(ferry_host_free(d2, hp) == FERRY_EINVAL);
  EXPECT(ferry_memcpy_async(s, NULL, hp, 10, FERRY_COPY_H2D) == FERRY_EINVAL);
  EXPECT(ferry_memcpy_async(s, p, NULL, 10, FERRY_COPY_H2D) == FERRY_EINVAL);
  EXPECT(ferry_memcpy_async(s, stack, hp, 10, FERRY_COPY_H2D) == FERRY_EINVAL); /* dst not device */
  EXPECT(ferry_memcpy_async(s, p, hp, 2048, FERRY_COPY_H2D) == FERRY_EINVAL);   /* past the block */
  EXPECT(ferry_memcpy_async(s, hp, p, 10, FERRY_COPY_H2D) == FERRY_EINVAL);     /* kinds swapped */
  EXPECT(ferry_memcpy_async(s, p, hp, 10, (ferry_copy_kind)99) == FERRY_EINVAL);
  EXPECT(ferry_memcpy_async(NULL, p, hp, 10, FERRY_COPY_H2D) == FERRY_EINVAL);
  EXPECT(ferry_memcpy_async(s, p, hp, 0, FERRY_COPY_H2D) == 0); /* 0 bytes: nothing */
  EXPECT(ferry_memset_async(s, stack, 0, 10) == FERRY_EINVAL);
  EXPECT(ferry_launch_host_func(s, NULL, NULL) == FERRY_EINVAL);
  EXPECT(ferry_stream_sleep(s, -1) == FERRY_EINVAL);
  EXPECT(ferry_event_record(e2, s) == FERRY_EINVAL); /* event of another device */
  EXPECT(ferry_stream_wait_event(s, e2) == FERRY_EINVAL);
  EXPECT(ferry_event_record(NULL, s) == FERRY_EINVAL);
  EXPECT(ferry_stream_synchronize(NULL) == FERRY_EINVAL);
  EXPECT(ferry_stream_destroy(NULL) == 0);
  EXPECT(ferry_event_destroy(NULL) == 0);
  EXPECT(ferry_device_create(NULL, NULL) == FERRY_EINVAL);
  EXPECT(ferry_device_get_info(d, NULL) == FERRY_EINVAL);
  EXPECT(ferry_stream_synchronize(s) == 0);
  ferry_device_destroy(NULL);
  ferry_device_destroy(d);
  ferry_device_destroy(d2);

  if (kind == FERRY_DEVICE_HOST) {
    ferry_device_config c = ferry_device_config_default();
    c.kind = FERRY_DEVICE_HOST;
    ferry_device *x = NULL;
    EXPECT(ferry_device_create(&c, &x) == FERRY_EINVAL && x == NULL); /* capacity 0 */
    EXPECT(strstr(ferry_last_error(), "capacity") != NULL);
    c.kind = (ferry_device_kind)7;
    c.capacity = 1 << 20;
    EXPECT(ferry_device_create(&c, &x) == FERRY_EINVAL);
  }
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "host";
  if (!test_backend_arg(which, &kind)) {
    fprintf(stderr, "usage: test_backend host|cuda\n");
    return 2;
  }
  ferry_device_info info;
  ferry_device *d = make(1 << 20);
  REQUIRE(ferry_device_get_info(d, &info) == 0);
  printf("backend %s: %s\n", which, info.name);
  EXPECT(info.emulated == (kind == FERRY_DEVICE_HOST));
  ferry_device_destroy(d);

  test_capacity();
  test_copies();
  test_events();
  test_many_streams();
  test_destroy_in_flight();
  test_host_funcs();
  test_bad_args();
  return test_finish(kind == FERRY_DEVICE_HOST ? "test_backend host" : "test_backend cuda");
}
