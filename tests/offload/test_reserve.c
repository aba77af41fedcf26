/* tests/offload/test_reserve.c — ferry_engine_reserve / ferry_engine_reserved
 * on the host backend: the reservation comes out of the device budget
 * before the memory manager gets the rest; too large a one fails finalize
 * with FERRY_ENOMEM naming the sizes; the calls are refused on the wrong
 * side of finalize; the block is device memory the caller can use, 256-byte
 * aligned, and goes back to the device at destroy.
 */
#include "bench/synth_model.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <stdint.h>

#define G 4
#define D 32

static ferry_engine *make_engine(const char *gpu_budget, const char *placement) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"8K\";\n"
           "tiers: { gpu: { budget = \"%s\"; }; host: { budget = \"16M\"; pinned = false; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; threads = 1; };\n"
           "precision: { params = \"bf16\"; };\n"
           "placement: { %s };\n",
           gpu_budget, placement);
  return eu_engine(text, NULL);
}

static const char *offloaded = "params = \"host\"; grads = \"host\"; optimizer = \"host\";";
static const char *resident = "params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\";";

/* The manager's device budget and the device's used bytes after finalize,
 * with `reserve` bytes reserved (0: no call). */
static void budgets(size_t reserve, uint64_t *manager, size_t *used) {
  ferry_engine *e = make_engine("1M", offloaded);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, 2, FERRY_DT_BF16) == 0);
  REQUIRE(synth_register(e, &m) == 0);
  if (reserve) REQUIRE(ferry_engine_reserve(e, reserve) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  ferry_stats st;
  REQUIRE(ferry_engine_get_stats(e, &st) == 0);
  *manager = st.budget[FERRY_TIER_DEVICE];
  ferry_device_info di;
  REQUIRE(ferry_device_get_info(ferry_engine_device(e), &di) == 0);
  *used = di.used;
  void *p = (void *)1;
  size_t n = 1;
  EXPECT(ferry_engine_reserved(e, &p, &n) == 0);
  if (!reserve) EXPECT(p == NULL && n == 0);
  ferry_engine_destroy(e);
  synth_free(&m);
}

static void test_shrinks_manager(void) {
  uint64_t m0, m1;
  size_t u0, u1;
  budgets(0, &m0, &u0);
  budgets(100000, &m1, &u1); /* not a multiple of 256: counted as 100096 */
  EXPECT_EQ_INT(m0 - m1, 100096);
  /* the device holds the manager's arena, the engine's buffers and the
   * reservation: the budget bounds them all */
  EXPECT(u0 <= 1 << 20 && u1 <= 1 << 20);
  EXPECT(u1 >= 100096 + m1);
}

static void test_too_large(void) {
  ferry_engine *e = make_engine("1M", offloaded);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, 2, FERRY_DT_BF16) == 0);
  REQUIRE(synth_register(e, &m) == 0);
  REQUIRE(ferry_engine_reserve(e, 2 << 20) == 0); /* more than the budget */
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ENOMEM);
  const char *msg = ferry_engine_last_error(e);
  printf("too large: %s\n", msg);
  EXPECT(strstr(msg, "reservation") && strstr(msg, "2097152") && strstr(msg, "1048576"));
  EXPECT(strstr(msg, "gradient buffers") != NULL);
  ferry_engine_destroy(e);

  /* Beside the grad buffers it fits, but the manager is left less than the
   * model's chunks need (all resident). */
  e = make_engine("64K", resident);
  REQUIRE(synth_register(e, &m) == 0);
  REQUIRE(ferry_engine_reserve(e, 40 << 10) == 0);
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ENOMEM);
  msg = ferry_engine_last_error(e);
  printf("no room for chunks: %s\n", msg);
  EXPECT(strstr(msg, "reservation") && strstr(msg, "40960") != NULL);
  ferry_engine_destroy(e);
  synth_free(&m);
}

static void test_order_and_use(void) {
  ferry_engine *e = make_engine("1M", offloaded);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, 2, FERRY_DT_BF16) == 0);
  REQUIRE(synth_register(e, &m) == 0);
  void *p = NULL;
  size_t n = 0;
  EXPECT_EQ_INT(ferry_engine_reserved(e, &p, &n), FERRY_EINVAL);
  EXPECT(strstr(ferry_engine_last_error(e), "after ferry_engine_finalize") != NULL);
  REQUIRE(ferry_engine_reserve(e, 1 << 20) == 0);
  REQUIRE(ferry_engine_reserve(e, 5000) == 0); /* replaces the amount */
  REQUIRE(ferry_engine_finalize(e) == 0);
  EXPECT_EQ_INT(ferry_engine_reserve(e, 4096), FERRY_EINVAL);
  EXPECT(strstr(ferry_engine_last_error(e), "before ferry_engine_finalize") != NULL);
  REQUIRE(ferry_engine_reserved(e, &p, &n) == 0);
  EXPECT(p != NULL);
  EXPECT_EQ_INT(n, 5000);
  EXPECT_EQ_INT((uintptr_t)p % 256, 0);
  /* usable through the device, in stream order */
  ferry_device *dev = ferry_engine_device(e);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(dev, &s) == 0);
  unsigned char *back = NULL;
  REQUIRE(ferry_host_alloc(dev, n, (void **)&back) == 0);
  EXPECT(ferry_memset_async(s, p, 0xA5, n) == 0);
  EXPECT(ferry_memset_async(s, (char *)p + n - 8, 0x3C, 8) == 0);
  EXPECT(ferry_memcpy_async(s, back, p, n, FERRY_COPY_D2H) == 0);
  EXPECT(ferry_stream_synchronize(s) == 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += back[i] != (i < n - 8 ? 0xA5 : 0x3C);
  EXPECT_EQ_INT(bad, 0);
  ferry_host_free(dev, back);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

int main(void) {
  test_shrinks_manager();
  test_too_large();
  test_order_and_use();
  return test_finish("offload.reserve");
}
