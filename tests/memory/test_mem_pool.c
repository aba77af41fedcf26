/* tests/memory/test_mem_pool.c — the tier pools' sub-allocator
 * (memory/pool.c): first fit from the bottom, last fit from the top,
 * coalescing on free, and the case the top end is for: chunks held from
 * both ends leave the free room in one hole, where first fit alone leaves
 * it in several that no chunk fits.
 */
#include "memory/mem_impl.h"
#include "tests/test.h"

#define K 1024

/* The largest free block. */
static size_t largest_hole(const mem_pool *p) {
  size_t m = 0;
  for (size_t i = 0; i < p->n; i++)
    if (!p->b[i].used && p->b[i].size > m) m = p->b[i].size;
  return m;
}

static void test_ends(void) {
  mem_pool p;
  EXPECT_EQ_INT(mem_pool_init(&p, 100 * K, K, 8), 0);
  size_t a, b, c, d;
  EXPECT_EQ_INT(mem_pool_alloc(&p, 10 * K, &a), 0);
  EXPECT_EQ_INT(mem_pool_alloc_top(&p, 20 * K, &b), 0);
  EXPECT_EQ_INT(mem_pool_alloc_top(&p, 5 * K + 1, &c), 0); /* rounds up to 6K */
  EXPECT_EQ_INT(mem_pool_alloc(&p, 10 * K, &d), 0);
  EXPECT(a == 0 && b == 80 * K && c == 74 * K && d == 10 * K);
  EXPECT(p.used == 46 * K && largest_hole(&p) == 54 * K);
  size_t x;
  EXPECT_EQ_INT(mem_pool_alloc_top(&p, 55 * K, &x), FERRY_ENOMEM);
  EXPECT_EQ_INT(mem_pool_alloc_top(&p, 54 * K, &x), 0); /* exactly the hole */
  EXPECT(x == 20 * K && p.used == 100 * K);
  mem_pool_free(&p, x);
  mem_pool_free(&p, c);
  mem_pool_free(&p, d); /* coalesce with the free room on both sides */
  EXPECT(largest_hole(&p) == 70 * K);
  mem_pool_free(&p, a);
  mem_pool_free(&p, b);
  EXPECT(p.n == 1 && p.used == 0 && largest_hole(&p) == 100 * K);
  mem_pool_destroy(&p);
}

/* Cached blocks (freed later) between held ones: the loop's 2K block and
 * two 4K optimizer blocks. First fit for all leaves 12K free in four 3K
 * holes; with the optimizer's from the top the free room stays in two
 * holes, one of 6K. */
static size_t interleaved(int top) {
  mem_pool p;
  EXPECT_EQ_INT(mem_pool_init(&p, 22 * K, K, 32), 0);
  size_t x1, x2, x3, a, b, l;
  EXPECT_EQ_INT(mem_pool_alloc(&p, 3 * K, &x1), 0);
  EXPECT_EQ_INT(top ? mem_pool_alloc_top(&p, 4 * K, &a) : mem_pool_alloc(&p, 4 * K, &a), 0);
  EXPECT_EQ_INT(mem_pool_alloc(&p, 3 * K, &x2), 0);
  EXPECT_EQ_INT(mem_pool_alloc(&p, 2 * K, &l), 0);
  EXPECT_EQ_INT(mem_pool_alloc(&p, 3 * K, &x3), 0);
  EXPECT_EQ_INT(top ? mem_pool_alloc_top(&p, 4 * K, &b) : mem_pool_alloc(&p, 4 * K, &b), 0);
  mem_pool_free(&p, x1);
  mem_pool_free(&p, x2);
  mem_pool_free(&p, x3);
  EXPECT(p.used == 10 * K);
  size_t hole = largest_hole(&p);
  mem_pool_destroy(&p);
  return hole;
}

int main(void) {
  test_ends();
  size_t ff = interleaved(0), two = interleaved(1);
  EXPECT(ff == 3 * K);  /* 12K free, no 4K block fits */
  EXPECT(two == 6 * K); /* a third 4K block fits */
  return test_finish("test_mem_pool");
}
