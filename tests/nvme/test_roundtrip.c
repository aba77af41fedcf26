/* tests/nvme/test_roundtrip.c — random data through the swap store and back:
 * 1 and 3 directories, sizes from 1 byte to 256 MiB with unaligned tails,
 * rewrites into shadow slots, registered buffers, buffered fallback, poll,
 * wait and callback completion, what ferry_swap_req_times tells, file
 * modes and cleanup, misuse errors (a buffer too large to register).
 */
#include "nvme_test.h"

#include <stdatomic.h>

static const size_t sizes[] = {1,        100,       511,           512,
                               4095,     4096,      4097,          65537,
                               (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (3 << 20) + 517,
                               (8 << 20) + 4096 + 3, 17 << 20};
#define NS (sizeof sizes / sizeof sizes[0])

static ferry_swap_config cfg_for(char dirs[][1200], int n, size_t slot, uint32_t nslots) {
  ferry_swap_config c = ferry_swap_config_default();
  for (int i = 0; i < n; i++) c.paths[i] = dirs[i];
  c.npaths = n;
  c.slot_size = slot;
  c.nslots = nslots;
  return c;
}

/* What ferry_swap_req_times tells of finished request r: its op, and a
 * completion time not before its start. */
static void expect_times(const ferry_swap_req *r, int op) {
  int got = -1;
  double t_submit = 0, t_done = 0;
  ferry_swap_req_times(r, &got, &t_submit, &t_done);
  EXPECT_EQ_INT(got, op);
  EXPECT(t_submit > 0 && t_done >= t_submit);
}

/* Writes every size to its own chunk (all in flight at once), reads them
 * back, rewrites the odd ones with new data and reads everything again. */
static void roundtrip(ferry_swap *s, unsigned long long seed, int use_regs) {
  unsigned char *src[NS], *dst[NS];
  ferry_swap_req req[NS];
  struct iovec iov[2 * NS];
  for (size_t i = 0; i < NS; i++) {
    src[i] = nt_alloc(sizes[i]);
    dst[i] = nt_alloc(sizes[i]);
    nt_fill(src[i], sizes[i], seed + i);
    iov[2 * i] = (struct iovec){src[i], ferry_align_up(sizes[i], 4096)};
    iov[2 * i + 1] = (struct iovec){dst[i], ferry_align_up(sizes[i], 4096)};
  }
  if (use_regs) EXPECT_EQ_INT(ferry_swap_register_buffers(s, iov, 2 * NS), FERRY_OK);
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < NS; i++) {
      if (pass && !(i & 1)) continue;
      if (pass) nt_fill(src[i], sizes[i], seed + 1000 + i);
      EXPECT_EQ_INT(ferry_swap_write(s, (uint32_t)i, src[i], sizes[i], &req[i], NULL, NULL),
                    FERRY_OK);
    }
    for (size_t i = 0; i < NS; i++) {
      if (pass && !(i & 1)) continue;
      int st = ferry_swap_wait(&req[i]);
      if (st) fprintf(stderr, "write %zu: %s\n", i, ferry_swap_last_error(s));
      EXPECT_EQ_INT(st, FERRY_OK);
      EXPECT_EQ_INT(ferry_swap_chunk_len(s, (uint32_t)i), sizes[i]);
      expect_times(&req[i], 1);
    }
    for (size_t i = 0; i < NS; i++) {
      memset(dst[i], 0xA5, sizes[i]);
      EXPECT_EQ_INT(ferry_swap_read(s, (uint32_t)i, dst[i], sizes[i], &req[i], NULL, NULL),
                    FERRY_OK);
    }
    for (size_t i = 0; i < NS; i++) {
      int st = ferry_swap_wait(&req[i]);
      if (st) fprintf(stderr, "read %zu: %s\n", i, ferry_swap_last_error(s));
      EXPECT_EQ_INT(st, FERRY_OK);
      expect_times(&req[i], 0);
      if (memcmp(src[i], dst[i], sizes[i])) {
        fprintf(stderr, "pass %d: chunk %zu (%zu bytes) differs\n", pass, i, sizes[i]);
        test_failures++;
      }
    }
  }
  if (use_regs) EXPECT_EQ_INT(ferry_swap_register_buffers(s, NULL, 0), FERRY_OK);
  for (size_t i = 0; i < NS; i++) {
    free(src[i]);
    free(dst[i]);
  }
}

static atomic_int cb_count;
static void count_cb(ferry_swap_req *r, int status, void *user) {
  (void)r;
  EXPECT_EQ_INT(status, FERRY_OK);
  atomic_fetch_add((atomic_int *)user, 1);
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "roundtrip", dir, sizeof dir);
  char dirs[3][1200];
  for (int i = 0; i < 3; i++) nt_subdir(dir, i, dirs[i], sizeof dirs[i]);

  { /* one directory, spares fewer than the writes in flight */
    ferry_swap_config c = cfg_for(dirs, 1, 17 << 20, NS);
    c.spare_slots = 2;
    c.queue_depth = 8;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    ferry_swap_info in;
    ferry_swap_get_info(s, &in);
    EXPECT_EQ_INT(in.o_direct, 1);
    EXPECT(in.fixed_files);
    EXPECT_EQ_INT(nt_count_files(dirs[0]), 0); /* no name: it cannot outlive the process */
    roundtrip(s, 1, 0);
    ferry_swap_stats st;
    ferry_swap_get_stats(s, &st);
    EXPECT(st.writes == NS + NS / 2 && st.reads == 2 * NS);
    EXPECT_EQ_INT(st.crc_errors, 0);
    /* every byte read was checked, and the checks were timed */
    EXPECT(st.read_check_bytes == st.bytes_read && st.read_check_seconds > 0);
    ferry_swap_close(s);
    EXPECT_EQ_INT(nt_count_files(dirs[0]), 0);
  }
  { /* three directories, blocks striped over them, registered buffers,
     * read checks shared with two check threads */
    ferry_swap_config c = cfg_for(dirs, 3, 17 << 20, NS);
    c.block_size = 256 << 10;
    c.queue_depth = 16;
    c.check_threads = 2;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    for (int i = 0; i < 3; i++) EXPECT_EQ_INT(nt_count_files(dirs[i]), 0);
    ferry_swap_info in;
    ferry_swap_get_info(s, &in);
    EXPECT_EQ_INT(in.check_threads, 2);
    roundtrip(s, 2, 1);
    /* a buffer above io_uring's 1 GiB a buffer: refused naming it (the
     * kernel's answer was EFAULT, "Bad address") */
    static unsigned char one[4096];
    struct iovec big[2] = {{one, sizeof one}, {one, ((size_t)1 << 30) + 4096}};
    EXPECT_EQ_INT(ferry_swap_register_buffers(s, big, 2), FERRY_EINVAL);
    EXPECT(strstr(ferry_swap_last_error(s), "buffer 2 of 2") &&
           strstr(ferry_swap_last_error(s), "1 GiB"));
    ferry_swap_stats st;
    ferry_swap_get_stats(s, &st);
    EXPECT(st.read_check_bytes == st.bytes_read && st.crc_errors == 0);
    EXPECT(st.submit_calls > 0 && st.submit_calls <= st.ios);
    ferry_swap_close(s);
    for (int i = 0; i < 3; i++) EXPECT_EQ_INT(nt_count_files(dirs[i]), 0);
  }
  { /* buffered fallback (as on a file system without O_DIRECT), kept files */
    ferry_swap_config c = cfg_for(dirs, 2, 17 << 20, NS);
    c.force_buffered = 1;
    c.keep_files = 1;
    c.spare_slots = 1;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    ferry_swap_info in;
    ferry_swap_get_info(s, &in);
    EXPECT_EQ_INT(in.o_direct, 0);
    roundtrip(s, 3, 0);
    /* kept files have names, 0600 */
    char cmd0[4000];
    snprintf(cmd0, sizeof cmd0, "test \"$(stat -c %%a %s/ferry-swap-*.swap)\" = 600", dirs[0]);
    EXPECT_EQ_INT(system(cmd0), 0);
    ferry_swap_close(s);
    for (int i = 0; i < 2; i++) { /* a data file each, and the index in the first */
      EXPECT_EQ_INT(nt_count_files(dirs[i]), i == 0 ? 2 : 1);
      char cmd[8000];
      snprintf(cmd, sizeof cmd, "rm -f %s/ferry-swap-*.swap %s/ferry-swap-*.index", dirs[i], dirs[i]);
      EXPECT_EQ_INT(system(cmd), 0);
    }
  }
  { /* 256 MiB less 3 bytes in one request; callbacks and polling; its
     * 256 pieces checked by the completion thread and a check thread */
    size_t n = (256u << 20) - 3;
    ferry_swap_config c = cfg_for(dirs, 1, 256u << 20, 2);
    c.spare_slots = 1;
    c.check_threads = 1;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    unsigned char *a = nt_alloc(n), *b = nt_alloc(n);
    nt_fill(a, n, 77);
    ferry_swap_req r1, r2;
    EXPECT_EQ_INT(ferry_swap_write(s, 1, a, n, &r1, count_cb, &cb_count), FERRY_OK);
    EXPECT_EQ_INT(ferry_swap_write(s, 1, a, n, &r2, NULL, NULL), FERRY_EBUSY);
    ferry_swap_drain(s);
    EXPECT_EQ_INT(atomic_load(&cb_count), 1);
    EXPECT_EQ_INT(ferry_swap_read(s, 1, b, n, &r1, NULL, NULL), FERRY_OK);
    int st;
    while ((st = ferry_swap_poll(&r1)) == FERRY_EAGAIN) usleep(1000);
    EXPECT_EQ_INT(st, FERRY_OK);
    EXPECT(memcmp(a, b, n) == 0);
    /* misuse */
    EXPECT_EQ_INT(ferry_swap_read(s, 0, b, 10, &r1, NULL, NULL), FERRY_ESTATE);
    EXPECT_EQ_INT(ferry_swap_read(s, 1, b, 10, &r1, NULL, NULL), FERRY_EINVAL);
    EXPECT(strstr(ferry_swap_last_error(s), "holds") != NULL);
    EXPECT_EQ_INT(ferry_swap_read(s, 2, b, n, &r1, NULL, NULL), FERRY_EINVAL);
    EXPECT_EQ_INT(ferry_swap_write(s, 0, a + 1, 100, &r1, NULL, NULL), FERRY_EINVAL);
    EXPECT(strstr(ferry_swap_last_error(s), "aligned") != NULL);
    EXPECT_EQ_INT(ferry_swap_write(s, 0, a, (256u << 20) + 1, &r1, NULL, NULL), FERRY_EINVAL);
    ferry_swap_close(s);
    free(a);
    free(b);
  }
  nt_cleanup(dir, 3);
  return test_finish("nvme.roundtrip");
}
