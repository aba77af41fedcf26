/* tests/core/test_core.c — status strings, size parsing, error buffers,
 * the logger's level filter and the OpenBLAS kernel chosen by SIMD bits.
 */
#include "core/core.h"
#include "tests/test.h"

#include <string.h>

static int logged;
static void count_log(void *u, int level, const char *m) {
  (void)u;
  (void)level;
  (void)m;
  logged++;
}

int main(void) {
  EXPECT(strcmp(ferry_strerror(FERRY_OK), "success") == 0);
  EXPECT(strcmp(ferry_strerror(FERRY_ENOMEM), "out of memory") == 0);
  EXPECT(strcmp(ferry_strerror(12345), "unknown status") == 0);
  EXPECT(strcmp(ferry_version(), FERRY_VERSION_STRING) == 0);

  uint64_t v = 0;
  EXPECT(ferry_parse_size("64M", &v) == 0 && v == 64ull << 20);
  EXPECT(ferry_parse_size("20G", &v) == 0 && v == 20ull << 30);
  EXPECT(ferry_parse_size("1.5T", &v) == 0 && v == 3ull << 39);
  EXPECT(ferry_parse_size("4096", &v) == 0 && v == 4096);
  EXPECT(ferry_parse_size("512k", &v) == 0 && v == 512ull << 10);
  EXPECT(ferry_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
  EXPECT(ferry_parse_size(" 8 MB ", &v) == 0 && v == 8ull << 20);
  EXPECT(ferry_parse_size("", &v) == FERRY_EINVAL);
  EXPECT(ferry_parse_size("-1G", &v) == FERRY_EINVAL);
  EXPECT(ferry_parse_size("12Q", &v) == FERRY_EINVAL);
  EXPECT(ferry_parse_size("1.3", &v) == FERRY_EINVAL);
  EXPECT(ferry_parse_size("G", &v) == FERRY_EINVAL);
  EXPECT(ferry_parse_size("99999999999P", &v) == FERRY_EOVERFLOW);
  EXPECT(ferry_parse_size(NULL, &v) == FERRY_EINVAL);

  ferry_errbuf e;
  ferry_errbuf_init(&e);
  EXPECT(strcmp(ferry_err_msg(&e), "") == 0);
  EXPECT(ferry_err(&e, FERRY_EIO, "read of %s at %d", "/x", 42) == FERRY_EIO);
  EXPECT(strcmp(ferry_err_msg(&e), "read of /x at 42") == 0);
  /* a chained message says nothing twice (issue 25 item 15: "layout: layout:") */
  ferry_err_chain(&e, FERRY_ENOMEM, "finalize: layout: ", "layout: the host tier is full");
  EXPECT(strcmp(ferry_err_msg(&e), "finalize: layout: the host tier is full") == 0);
  ferry_err_chain(&e, FERRY_ENOMEM, "finalize: layout: ", "finalize: layout: x");
  EXPECT(strcmp(ferry_err_msg(&e), "finalize: layout: x") == 0);
  ferry_err_chain(&e, FERRY_EIO, "device: ", "devices: x"); /* not a repeat */
  EXPECT(strcmp(ferry_err_msg(&e), "device: devices: x") == 0);
  ferry_err_chain(&e, FERRY_EIO, "read: ", "layout: y");
  EXPECT(strcmp(ferry_err_msg(&e), "read: layout: y") == 0);
  ferry_err(&e, FERRY_EIO, "layout: z");
  ferry_err_chain(&e, FERRY_EIO, "layout: ", ferry_err_msg(&e)); /* its own message */
  EXPECT(strcmp(ferry_err_msg(&e), "layout: z") == 0);
  ferry_errbuf_destroy(&e);
  EXPECT(ferry_err_thread(FERRY_ENODEV, "no %s", "gpu") == FERRY_ENODEV);
  EXPECT(strcmp(ferry_last_error(), "no gpu") == 0);

  /* silent by default; level filter applies */
  ferry_logf(NULL, FERRY_LOG_ERROR, "dropped");
  EXPECT(logged == 0);
  ferry_log_set(count_log, NULL, FERRY_LOG_WARN);
  ferry_logf(NULL, FERRY_LOG_ERROR, "kept");
  ferry_logf(NULL, FERRY_LOG_INFO, "dropped");
  EXPECT(logged == 1);
  ferry_logger own = {count_log, NULL, FERRY_LOG_DEBUG};
  ferry_logf(&own, FERRY_LOG_DEBUG, "kept");
  EXPECT(logged == 2);
  ferry_log_set(NULL, NULL, 0);
  ferry_logf(NULL, FERRY_LOG_ERROR, "dropped");
  EXPECT(logged == 2);

  /* OpenBLAS's Prescott fallback is replaced by the best kernel the bits
   * allow; its own picks, and CPUs below AVX2+FMA, are kept */
  const unsigned a2 = FERRY_SIMD_AVX2 | FERRY_SIMD_FMA,
                 a5 = a2 | FERRY_SIMD_AVX512F | FERRY_SIMD_AVX512BW | FERRY_SIMD_AVX512VL;
  EXPECT(!strcmp(ferry_cpu_blas_kernel(a5 | FERRY_SIMD_AVX512BF16, "Prescott"), "Cooperlake"));
  EXPECT(!strcmp(ferry_cpu_blas_kernel(a5, "Prescott"), "SkylakeX"));
  EXPECT(!strcmp(ferry_cpu_blas_kernel(a2 | FERRY_SIMD_AVX512F, "Prescott"), "Haswell"));
  EXPECT(!strcmp(ferry_cpu_blas_kernel(a2, "Prescott"), "Haswell"));
  EXPECT(ferry_cpu_blas_kernel(FERRY_SIMD_AVX2, "Prescott") == NULL);
  EXPECT(ferry_cpu_blas_kernel(FERRY_SIMD_SSE42, "Prescott") == NULL);
  EXPECT(ferry_cpu_blas_kernel(a5, "Haswell") == NULL);
  EXPECT(ferry_cpu_blas_kernel(a5, "Zen") == NULL);
  EXPECT(ferry_cpu_blas_kernel(a5, NULL) == NULL);

  char buf[32];
  EXPECT(strcmp(ferry_format_size(1536, buf, sizeof buf), "1.50 KiB") == 0);
  EXPECT(strcmp(ferry_format_size(7, buf, sizeof buf), "7 B") == 0);
  return test_finish("test_core");
}
