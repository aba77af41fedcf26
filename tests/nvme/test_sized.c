/* tests/nvme/test_sized.c — slots sized per chunk (ferry_swap_config.
 * slot_sizes): one chunk dwarfs the rest, and the files hold each chunk's
 * own bytes plus the spares, of their own sizes too (1 and 3 directories); rewrites move chunks
 * between slots of different sizes (the smallest free slot that holds
 * them), with fewer spares than writes in flight and with none free that
 * fits (in place); a failed shadow write leaves the old bytes; kept files
 * reopen with their sizes; a write larger than the chunk's slot is refused.
 */
#include "nvme_test.h"

#include <fcntl.h>
#include <sys/stat.h>

/* the chunks' slots, then two spares: one of the largest chunk, one of
 * the largest of the rest */
static const size_t sizes[] = {24u << 20, 4096,       700,   (1 << 20) + 513,  (2 << 20) - 1,
                               (3 << 20) + 4096, 1 << 20, 65537, (1 << 20) + 4095, 24u << 20,
                               (3 << 20) + 4096};
#define NS (sizeof sizes / sizeof sizes[0] - 2)
#define BIG ((size_t)24 << 20)

/* Writes every chunk (all in flight at once) with seed + i, waits. */
static void write_all(ferry_swap *s, unsigned char **buf, unsigned long long seed, int odd_only) {
  ferry_swap_req req[NS];
  for (size_t i = 0; i < NS; i++) {
    if (odd_only && !(i & 1)) continue;
    nt_fill(buf[i], sizes[i], seed + i);
    EXPECT_EQ_INT(ferry_swap_write(s, (uint32_t)i, buf[i], sizes[i], &req[i], NULL, NULL),
                  FERRY_OK);
  }
  for (size_t i = 0; i < NS; i++) {
    if (odd_only && !(i & 1)) continue;
    int st = ferry_swap_wait(&req[i]);
    if (st) fprintf(stderr, "write %zu: %s\n", i, ferry_swap_last_error(s));
    EXPECT_EQ_INT(st, FERRY_OK);
  }
}

/* Reads every chunk back and compares it with buf. */
static void check_all(ferry_swap *s, unsigned char **buf, const char *what) {
  for (size_t i = 0; i < NS; i++) {
    unsigned char *b = nt_alloc(sizes[i]);
    memset(b, 0xA5, sizes[i]);
    ferry_swap_req r;
    int st = ferry_swap_read(s, (uint32_t)i, b, sizes[i], &r, NULL, NULL);
    if (st == FERRY_OK) st = ferry_swap_wait(&r);
    EXPECT_EQ_INT(st, FERRY_OK);
    if (st == FERRY_OK && memcmp(b, buf[i], sizes[i])) {
      fprintf(stderr, "%s: chunk %zu (%zu bytes) differs\n", what, i, sizes[i]);
      test_failures++;
    }
    free(b);
  }
}

/* The files' bytes: each chunk's own (its rows of blocks, the tail
 * rounded to oa with one directory) and the spares' slot_size each. */
static uint64_t expected_bytes(const ferry_swap_info *in, int npaths, uint32_t spares) {
  uint64_t t = 0, bs = in->block_size, oa = in->offset_align;
  for (size_t i = 0; i < NS + spares; i++) {
    uint64_t z = sizes[i], pos = (z + bs - 1) / bs;
    uint64_t rows = (pos - 1) / (uint64_t)npaths, last = pos - rows * (uint64_t)npaths;
    t += rows * bs + (last == 1 ? (z - (pos - 1) * bs + oa - 1) / oa * oa : bs);
  }
  return t * (uint64_t)npaths;
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "sized", dir, sizeof dir);
  char dirs[3][1200];
  for (int i = 0; i < 3; i++) nt_subdir(dir, i, dirs[i], sizeof dirs[i]);
  unsigned char *buf[NS];
  uint64_t data = 0;
  for (size_t i = 0; i < NS; i++) {
    buf[i] = nt_alloc(sizes[i]);
    data += sizes[i];
  }

  for (int npaths = 1; npaths <= 3; npaths += 2) {
    ferry_swap_config c = ferry_swap_config_default();
    for (int i = 0; i < npaths; i++) c.paths[i] = dirs[i];
    c.npaths = npaths;
    c.slot_size = BIG;
    c.slot_sizes = sizes;
    c.nslots = NS;
    c.spare_slots = 2;
    c.queue_depth = 8;
    c.block_size = npaths == 1 ? 1u << 20 : 256u << 10;
    c.keep_files = 1;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    ferry_swap_info in;
    REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
    uint64_t want = expected_bytes(&in, npaths, 2);
    EXPECT(in.file_bytes * (uint64_t)npaths == want);
    /* the files on disk: the data, the two spares, the rounding */
    uint64_t disk = 0;
    char idx[1200];
    snprintf(idx, sizeof idx, "%s", in.index_path);
    for (int i = 0; i < npaths; i++) {
      char cmd[4000];
      snprintf(cmd, sizeof cmd, "stat -c %%s %s/ferry-swap-*.swap", dirs[i]);
      FILE *p = popen(cmd, "r");
      unsigned long long n = 0;
      REQUIRE(p && fscanf(p, "%llu", &n) == 1);
      pclose(p);
      disk += n;
    }
    printf("%d dir(s): data %llu, spares %zu, files %llu (uniform slots: %llu)\n", npaths,
           (unsigned long long)data, BIG + sizes[NS + 1], (unsigned long long)disk,
           (unsigned long long)((NS + 2) * BIG));
    EXPECT(disk == want);
    EXPECT(disk <= data + BIG + sizes[NS + 1] + (NS + 2) * (uint64_t)npaths * c.block_size);
    if (npaths == 1) EXPECT(disk <= data + BIG + sizes[NS + 1] + (NS + 2) * 4096);

    /* writes: all in flight (2 spares), then again and again, so chunks
     * move between slots of other sizes */
    for (int pass = 0; pass < 4; pass++) {
      write_all(s, buf, 100 * (unsigned long long)pass + (unsigned long long)npaths, pass & 1);
      check_all(s, buf, "rewrite");
    }
    /* a chunk never grows past the slot it holds now */
    ferry_swap_req r;
    unsigned char *big = nt_alloc(BIG);
    EXPECT_EQ_INT(ferry_swap_write(s, 1, big, 8192, &r, NULL, NULL), FERRY_EINVAL);
#if FERRY_FAULT_INJECTION
    /* a failed shadow write of the big chunk leaves its bytes */
    ferry_fault f = {FERRY_FAULT_EIO, 1, 0, 2, 1, 0};
    EXPECT_EQ_INT(ferry_swap_fault_add(s, &f), FERRY_OK);
    memcpy(big, buf[0], BIG);
    big[7] ^= 1;
    EXPECT_EQ_INT(ferry_swap_write(s, 0, big, BIG, &r, NULL, NULL), FERRY_OK);
    EXPECT_EQ_INT(ferry_swap_wait(&r), FERRY_EIO);
    ferry_swap_fault_clear(s);
    check_all(s, buf, "after a failed write");
#endif
    free(big);
    ferry_swap_close(s);

    /* kept files reopen with each slot's size */
    ferry_swap_config rc = ferry_swap_config_default();
    REQUIRE(ferry_swap_reopen(&rc, idx, &s) == FERRY_OK);
    REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
    EXPECT(in.file_bytes * (uint64_t)npaths == want);
    check_all(s, buf, "reopened");
    write_all(s, buf, 900, 0);
    check_all(s, buf, "reopened, rewritten");
    ferry_swap_close(s); /* keep_files off: the files go */
    for (int i = 0; i < npaths; i++) EXPECT_EQ_INT(nt_count_files(dirs[i]), 0);
  }
  for (size_t i = 0; i < NS; i++) free(buf[i]);
  nt_cleanup(dir, 3);
  return test_finish("nvme.sized");
}
