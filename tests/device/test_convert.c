/* tests/device/test_convert.c — ferry_convert_async and the native stream,
 * run once per backend: `test_convert host` and `test_convert cuda` (exit 77
 * without a CUDA device). The converter's bits equal ferry_dtype_convert's
 * for every pair of F32/F16/BF16, every 16-bit pattern, f32 NaNs, infinities,
 * subnormals and rounding ties, scales other than 1 (inexact, overflowing,
 * subnormal, 0, inf, NaN), grids longer than one launch, odd lengths and
 * offsets and in place. Bad arguments are refused. ferry_stream_native and
 * ferry_stream_wrap: NULL and FERRY_ENOTSUP on host; on cuda the round trip,
 * and an adopted stream outlives its wrapper and the device.
 */
#include "ferry.h"
#include "tests/device/backend_arg.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define N_VALUES 65536
#define N_LONG   (3u << 20) /* longer than one launch's grid (8192 x 256) */

static ferry_device_kind kind;
static ferry_device *dev;
static ferry_stream *st;
static void *d_src, *d_dst, *h_buf; /* N_LONG f32 each */
static uint32_t *want;              /* reference output, N_LONG f32 */

static const ferry_dtype k_dts[3] = {FERRY_DT_F32, FERRY_DT_F16, FERRY_DT_BF16};

static float f32_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* f32 inputs that stress the rounding: specials, NaN payloads (signalling
 * and quiet), subnormals, values around the f16 and bf16 ties, the f16
 * overflow and underflow edges, then random bits. */
static void fill_f32(uint32_t *v, size_t n) {
  static const uint32_t special[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
      0xff800001u, 0x7fa00000u, 0x7fbfffffu, 0x7fffffffu, 0x00000001u, 0x807fffffu, 0x00400000u,
      0x3f800000u, 0xbf800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u,
      0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0xb3000000u, 0x32ffffffu, 0x33800000u,
      0x33c00000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x3f808000u, 0x3f818000u,
      0x3f807fffu, 0x3f808001u, 0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u};
  size_t k = 0;
  for (; k < sizeof special / sizeof special[0] && k < n; k++)
    v[k] = special[k];
  unsigned long long seed = 0x9e3779b97f4a7c15ull;
  for (; k < n; k++) {
    uint32_t r = (uint32_t)test_rand(&seed);
    switch (k % 8) {
    case 0: v[k] = r; break;                                     /* anything */
    case 1: v[k] = (r & 0xffff0000u) | 0x8000u; break;           /* bf16 tie */
    case 2: v[k] = (r & 0xffffe000u) | 0x1000u; break;           /* f16 tie (normal) */
    case 3: v[k] = (r & 0x807fffffu); break;                     /* f32 subnormal */
    case 4: v[k] = (r & 0x80ffffffu) | 0x33000000u; break;       /* f16 subnormal range */
    case 5: v[k] = (r & 0x87ffffffu) | 0x38000000u; break;       /* near f16's smallest normal */
    case 6: v[k] = (r & 0x80ffffffu) | 0x47000000u; break;       /* near f16's largest */
    default: v[k] = (r & 0x807fffffu) | 0x7f800000u | 1u; break; /* NaNs */
    }
  }
}

/* src values of dtype sdt: every 16-bit pattern, or fill_f32's list. */
static void fill_src(void *h, ferry_dtype sdt, size_t n) {
  if (sdt == FERRY_DT_F32) {
    fill_f32(h, n);
    return;
  }
  uint16_t *p = h;
  for (size_t i = 0; i < n; i++)
    p[i] = (uint16_t)i;
}

/* 1 when element i of got and want agree: same bits, except where the
 * source and the scale are both NaN (which NaN the host's multiply keeps
 * then depends on the compiler's operand order). */
static int same(const void *got, const void *ref, ferry_dtype dt, const void *src, ferry_dtype sdt,
                size_t i, float scale) {
  size_t sz = ferry_dtype_size(dt);
  if (!memcmp((const char *)got + i * sz, (const char *)ref + i * sz, sz)) return 1;
  return isnan(scale) && isnan(ferry_dtype_load(src, sdt, i));
}

/* Converts n elements from src offset `off` (elements) on the device,
 * compares with ferry_dtype_convert on the host; the number of mismatches. */
static size_t check_pair(ferry_dtype dt, ferry_dtype sdt, size_t n, size_t off, float scale,
                         int in_place) {
  size_t ssz = ferry_dtype_size(sdt), dsz = ferry_dtype_size(dt);
  size_t total = n + off;
  fill_src(h_buf, sdt, total);
  const char *hsrc = (const char *)h_buf + off * ssz;
  REQUIRE(ferry_dtype_convert(want, dt, hsrc, sdt, n, scale) == 0);
  REQUIRE(ferry_memcpy_async(st, d_src, h_buf, total * ssz, FERRY_COPY_H2D) == 0);
  void *src = (char *)d_src + off * ssz;
  void *dst = in_place ? src : (char *)d_dst + off * dsz;
  int rc = ferry_convert_async(st, dst, dt, src, sdt, n, scale);
  if (rc) fprintf(stderr, "convert: %s\n", ferry_device_last_error(dev));
  REQUIRE(rc == 0);
  /* Keep the source for the comparison: the result goes to the upper half. */
  void *got = (char *)h_buf + (size_t)N_LONG * 4;
  REQUIRE(ferry_memcpy_async(st, got, dst, n * dsz, FERRY_COPY_D2H) == 0);
  REQUIRE(ferry_stream_synchronize(st) == 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (same(got, want, dt, hsrc, sdt, i, scale)) continue;
    if (bad++ < 5) {
      uint32_t g = 0, w = 0, x = 0;
      memcpy(&g, (char *)got + i * dsz, dsz);
      memcpy(&w, (char *)want + i * dsz, dsz);
      memcpy(&x, hsrc + i * ssz, ssz);
      fprintf(stderr, "%s -> %s scale %g [%zu]: src 0x%08x got 0x%08x want 0x%08x\n",
              ferry_dtype_name(sdt), ferry_dtype_name(dt), (double)scale, i, x, g, w);
    }
  }
  return bad;
}

static void test_bits(void) {
  const float scales[] = {1.0f,     0.5f,    -3.0f, 1e-3f,    0.1f, 1e30f,
                          1e-40f,   0.0f,    -0.0f, INFINITY, NAN,  f32_of(0x7f800001u),
                          65504.0f, 1.0f / 3};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        size_t bad = check_pair(k_dts[b], k_dts[a], N_VALUES, 0, scales[k], 0);
        if (bad)
          fprintf(stderr, "%s -> %s scale %g: %zu mismatches\n", ferry_dtype_name(k_dts[a]),
                  ferry_dtype_name(k_dts[b]), (double)scales[k], bad);
        EXPECT(bad == 0);
      }
}

static void test_shapes(void) {
  /* A grid-stride loop longer than one grid, odd lengths at odd offsets. */
  EXPECT(check_pair(FERRY_DT_BF16, FERRY_DT_F32, N_LONG, 0, 0.25f, 0) == 0);
  EXPECT(check_pair(FERRY_DT_F32, FERRY_DT_F16, N_LONG - 7, 3, 1.0f, 0) == 0);
  EXPECT(check_pair(FERRY_DT_F16, FERRY_DT_BF16, 1, 1, 2.0f, 0) == 0);
  EXPECT(check_pair(FERRY_DT_F16, FERRY_DT_F32, 257, 5, 1.0f, 0) == 0);
  /* In place with dtypes of one size. */
  EXPECT(check_pair(FERRY_DT_BF16, FERRY_DT_F16, N_VALUES, 0, 1.0f, 1) == 0);
  EXPECT(check_pair(FERRY_DT_F32, FERRY_DT_F32, N_VALUES, 1, 0.5f, 1) == 0);
}

static void test_bad_args(void) {
  char host[64];
  EXPECT(ferry_convert_async(NULL, d_dst, FERRY_DT_F32, d_src, FERRY_DT_F16, 4, 1) == FERRY_EINVAL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F64, d_src, FERRY_DT_F16, 4, 1) == FERRY_EINVAL);
  EXPECT(strstr(ferry_device_last_error(dev), "F64") != NULL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, d_src, FERRY_DT_I8, 4, 1) == FERRY_EINVAL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, d_src, (ferry_dtype)99, 4, 1) ==
         FERRY_EINVAL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, d_src, FERRY_DT_F16, 0, 1) == 0);
  EXPECT(ferry_convert_async(st, NULL, FERRY_DT_F32, d_src, FERRY_DT_F16, 4, 1) == FERRY_EINVAL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, NULL, FERRY_DT_F16, 4, 1) == FERRY_EINVAL);
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, d_src, FERRY_DT_F16, SIZE_MAX / 2, 1) ==
         FERRY_EINVAL);
  /* Past the end of the allocation. */
  EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, d_src, FERRY_DT_F32, N_LONG + 1, 1) ==
         FERRY_EINVAL);
  EXPECT(strstr(ferry_device_last_error(dev), "live allocation") != NULL);
  /* Overlap other than one buffer with dtypes of one size. */
  EXPECT(ferry_convert_async(st, d_src, FERRY_DT_F32, d_src, FERRY_DT_BF16, 64, 1) == FERRY_EINVAL);
  EXPECT(strstr(ferry_device_last_error(dev), "overlaps") != NULL);
  EXPECT(ferry_convert_async(st, (char *)d_src + 2, FERRY_DT_F16, d_src, FERRY_DT_BF16, 64, 1) ==
         FERRY_EINVAL);
  /* Host memory is not device memory on the host backend (on cuda a pointer
   * outside the arena may be the caller's own device memory). */
  if (kind == FERRY_DEVICE_HOST) {
    EXPECT(ferry_convert_async(st, d_dst, FERRY_DT_F32, host, FERRY_DT_F16, 4, 1) == FERRY_EINVAL);
    EXPECT(ferry_convert_async(st, host, FERRY_DT_F16, d_src, FERRY_DT_F32, 4, 1) == FERRY_EINVAL);
  }
  EXPECT(ferry_stream_synchronize(st) == 0);
}

static void test_native_host(void) {
  void *nat = (void *)1;
  EXPECT(ferry_stream_native(st, &nat) == 0 && nat == NULL);
  EXPECT(ferry_stream_native(st, NULL) == FERRY_EINVAL);
  EXPECT(ferry_stream_native(NULL, &nat) == FERRY_EINVAL);
  ferry_stream *w = (ferry_stream *)1;
  EXPECT(ferry_stream_wrap(dev, &nat, &w) == FERRY_ENOTSUP && w == NULL);
  EXPECT(strstr(ferry_device_last_error(dev), "host backend") != NULL);
  EXPECT(ferry_stream_wrap(dev, NULL, &w) == FERRY_EINVAL);
  EXPECT(ferry_stream_wrap(NULL, &nat, &w) == FERRY_EINVAL);
}

#ifdef FERRY_HAVE_CUDA
/* The round trip through ferry's own stream, and a stream of the caller's
 * that outlives its wrapper and the device. */
static void test_native_cuda(void) {
  void *nat = NULL;
  EXPECT(ferry_stream_native(st, &nat) == 0 && nat != NULL);
  ferry_stream *w = NULL;
  EXPECT(ferry_stream_wrap(dev, nat, &w) == 0 && w != NULL);
  void *back = NULL;
  EXPECT(ferry_stream_native(w, &back) == 0 && back == nat);
  ferry_stream *w_bad = (ferry_stream *)1; /* a refused wrap sets its out to NULL */
  EXPECT(ferry_stream_wrap(dev, NULL, &w_bad) == FERRY_EINVAL && w_bad == NULL);
  EXPECT(ferry_convert_async(w, d_dst, FERRY_DT_F16, d_src, FERRY_DT_F32, 1024, 1) == 0);
  EXPECT(ferry_stream_destroy(w) == 0);
  EXPECT(cudaStreamQuery((cudaStream_t)nat) == cudaSuccess); /* still ferry's, still alive */
  EXPECT(ferry_memset_async(st, d_dst, 0, 64) == 0 && ferry_stream_synchronize(st) == 0);

  cudaStream_t mine = NULL;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  ferry_device_config c = ferry_device_config_default();
  c.kind = FERRY_DEVICE_CUDA;
  c.capacity = 1 << 20;
  ferry_device *d2 = NULL;
  REQUIRE(ferry_device_create(&c, &d2) == 0);
  void *buf = NULL;
  REQUIRE(ferry_device_alloc(d2, 4096, &buf) == 0);
  EXPECT(ferry_stream_wrap(d2, (void *)mine, &w) == 0);
  EXPECT(ferry_memset_async(w, buf, 0x3c, 4096) == 0);
  EXPECT(ferry_convert_async(w, buf, FERRY_DT_BF16, buf, FERRY_DT_F16, 2048, 1) == 0);
  ferry_device_destroy(d2); /* synchronizes `mine` and forgets it */
  EXPECT(cudaStreamQuery(mine) == cudaSuccess);
  EXPECT(cudaStreamDestroy(mine) == cudaSuccess);
}
#endif

static int setup(const char *which) {
  if (!test_backend_arg(which, &kind)) return 0;
  ferry_device_config c = ferry_device_config_default();
  c.kind = kind;
  c.capacity = (size_t)64 << 20;
  int rc = ferry_device_create(&c, &dev);
  if (rc) fprintf(stderr, "device create: %s: %s\n", ferry_strerror(rc), ferry_last_error());
  REQUIRE(rc == 0);
  REQUIRE(ferry_stream_create(dev, &st) == 0);
  REQUIRE(ferry_device_alloc(dev, (size_t)N_LONG * 4, &d_src) == 0);
  REQUIRE(ferry_device_alloc(dev, (size_t)N_LONG * 4, &d_dst) == 0);
  REQUIRE(ferry_host_alloc(dev, (size_t)N_LONG * 4 * 2, &h_buf) == 0);
  want = malloc((size_t)N_LONG * 4);
  REQUIRE(want != NULL);
  return 1;
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "host";
  if (!setup(which)) {
    fprintf(stderr, "usage: test_convert host|cuda\n");
    return 2;
  }
  test_bits();
  test_shapes();
  test_bad_args();
  if (kind == FERRY_DEVICE_HOST) test_native_host();
#ifdef FERRY_HAVE_CUDA
  else
    test_native_cuda();
#endif
  free(want);
  ferry_device_destroy(dev);
  return test_finish(kind == FERRY_DEVICE_HOST ? "test_convert host" : "test_convert cuda");
}
