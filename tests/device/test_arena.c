/* tests/device/test_arena.c — the device sub-allocator: alignment, the hard
 * cap, coalescing, containment checks, and a randomized run against a
 * byte-map model.
 */
#include "device/arena.h"
#include "ferry.h"
#include "tests/test.h"

#include <string.h>

int main(void) {
  ferry_arena a;
  REQUIRE(ferry_arena_init(&a, 4096, 256) == 0);
  size_t o1, o2, o3, sz;
  EXPECT(ferry_arena_alloc(&a, 1, &o1) == 0 && o1 == 0);
  EXPECT(ferry_arena_alloc(&a, 300, &o2) == 0 && o2 == 256);
  EXPECT(a.used == 256 + 512);
  EXPECT(ferry_arena_alloc(&a, 4096, &o3) == FERRY_ENOMEM);
  EXPECT(ferry_arena_alloc(&a, 3328, &o3) == 0 && o3 == 768);
  EXPECT(ferry_arena_alloc(&a, 1, &o3) == FERRY_ENOMEM);
  EXPECT(ferry_arena_contains(&a, 256, 512));
  EXPECT(!ferry_arena_contains(&a, 256, 513));
  EXPECT(ferry_arena_free(&a, o2, &sz) == 0 && sz == 512);
  EXPECT(ferry_arena_free(&a, o2, &sz) == FERRY_EINVAL); /* double free */
  EXPECT(ferry_arena_free(&a, 10, &sz) == FERRY_EINVAL);  /* not a block start */
  EXPECT(!ferry_arena_contains(&a, 256, 1));
  EXPECT(ferry_arena_free(&a, 0, NULL) == 0);
  EXPECT(ferry_arena_free(&a, 768, NULL) == 0);
  EXPECT(a.n == 1 && a.used == 0 && a.nused == 0); /* fully coalesced */
  EXPECT(a.peak == 4096);
  EXPECT(ferry_arena_largest_free(&a) == 4096);
  ferry_arena_destroy(&a);

  /* randomized: a byte map of owners must never overlap, usage must add up */
  enum { CAP = 1 << 16, SLOTS = 64 };
  REQUIRE(ferry_arena_init(&a, CAP, 256) == 0);
  static unsigned char owner[CAP];
  memset(owner, 0, sizeof owner);
  size_t off[SLOTS], len[SLOTS];
  int live[SLOTS] = {0};
  unsigned long long seed = 0x1234567;
  for (int it = 0; it < 20000; it++) {
    int s = (int)(test_rand(&seed) % SLOTS);
    if (live[s]) {
      REQUIRE(ferry_arena_free(&a, off[s], NULL) == 0);
      for (size_t k = off[s]; k < off[s] + len[s]; k++) owner[k] = 0;
      live[s] = 0;
    } else {
      size_t want = (size_t)(test_rand(&seed) % 5000);
      if (ferry_arena_alloc(&a, want, &off[s]) == 0) {
        len[s] = want ? (want + 255) / 256 * 256 : 256;
        EXPECT(off[s] % 256 == 0 && off[s] + len[s] <= CAP);
        for (size_t k = off[s]; k < off[s] + len[s]; k++) {
          if (owner[k]) { EXPECT(owner[k] == 0); break; }
          owner[k] = (unsigned char)(s + 1);
        }
        live[s] = 1;
      }
    }
    size_t used = 0;
    for (int k = 0; k < SLOTS; k++) used += live[k] ? len[k] : 0;
    if (used != a.used) { EXPECT(used == a.used); break; }
  }
  ferry_arena_destroy(&a);
  return test_finish("test_arena");
}
