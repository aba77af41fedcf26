/* tests/nvme/test_reopen.c — kept files used again: a store closed with
 * keep_files writes its index, ferry_swap_reopen reads every chunk back
 * (three directories, unaligned tails, shadow rewrites), the CRCs survive
 * (a bit flipped on disk while closed is caught), and a damaged, truncated
 * or mismatched index, a missing or resized file are refused with their
 * names and leave everything in place; so is an index whose CRC holds but
 * whose geometry only adds up in 32-bit arithmetic.
 */
#include "nvme_test.h"
#include "core/crc32c.h"

#include <fcntl.h>

static const size_t sizes[] = {1, 700, 4096, (1 << 20) + 513, (2 << 20) - 1, 2 << 20};
#define NS (sizeof sizes / sizeof sizes[0])

static void write_chunk(ferry_swap *s, uint32_t c, size_t n, unsigned long long seed) {
  unsigned char *a = nt_alloc(n);
  nt_fill(a, n, seed);
  ferry_swap_req r;
  EXPECT_EQ_INT(ferry_swap_write(s, c, a, n, &r, NULL, NULL), FERRY_OK);
  EXPECT_EQ_INT(ferry_swap_wait(&r), FERRY_OK);
  free(a);
}

/* Reads chunk c and compares it with what seed makes; returns the status. */
static int check_chunk(ferry_swap *s, uint32_t c, size_t n, unsigned long long seed) {
  unsigned char *a = nt_alloc(n), *b = nt_alloc(n);
  nt_fill(a, n, seed);
  memset(b, 0, n);
  ferry_swap_req r;
  int rc = ferry_swap_read(s, c, b, n, &r, NULL, NULL);
  if (rc == FERRY_OK) rc = ferry_swap_wait(&r);
  if (rc == FERRY_OK && memcmp(a, b, n) != 0) rc = -1000;
  free(a);
  free(b);
  return rc;
}

static void copy_file(const char *from, const char *to) {
  char cmd[3000];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  REQUIRE(system(cmd) == 0);
}

static void flip_byte(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  REQUIRE(f);
  REQUIRE(fseek(f, off, off < 0 ? SEEK_END : SEEK_SET) == 0);
  int c = fgetc(f);
  REQUIRE(c != EOF);
  REQUIRE(fseek(f, -1, SEEK_CUR) == 0);
  fputc(c ^ 0x10, f);
  fclose(f);
}

static void put(unsigned char *b, size_t *n, const void *p, size_t len) {
  memcpy(b + *n, p, len);
  *n += len;
}
static void put32(unsigned char *b, size_t *n, uint32_t v) { put(b, n, &v, 4); }
static void put64(unsigned char *b, size_t *n, uint64_t v) { put(b, n, &v, 8); }

/* An index with a valid CRC over one slot of 2^32 - 1 one-byte positions:
 * cps 0 (positions + 1 wrapped) and so no CRC entries at all, a sparse data
 * file of the size it says. Reopened, every read or write of the chunk
 * would index CRCs past an empty array; the geometry check refuses it. */
static void crafted_geometry(const char *dir) {
  char data[1300], index[1300];
  snprintf(data, sizeof data, "%s/ferry-crafted-1-0-0.swap", dir);
  snprintf(index, sizeof index, "%s/ferry-crafted-1-0.index", dir);
  const uint64_t pos = UINT32_MAX;
  int fd = open(data, O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0 && ftruncate(fd, (off_t)pos) == 0);
  close(fd);
  unsigned char b[2048];
  size_t n = 0;
  put(b, &n, "FERRYIX1", 8);
  put32(b, &n, 2); /* version */
  put32(b, &n, 1); /* npaths */
  put64(b, &n, pos); /* slot_size */
  put64(b, &n, 1);   /* block */
  put64(b, &n, 1);   /* alignment */
  put64(b, &n, pos); /* file bytes */
  uint32_t g[9] = {1, 0, (uint32_t)pos, 0 /* cps */, (uint32_t)pos, 1, 0, 1, 0};
  for (int i = 0; i < 9; i++) put32(b, &n, g[i]); /* nslots, spares, positions, cps, ppf,
                                                    * nphys, direct, verify, tight */
  put32(b, &n, (uint32_t)strlen(data));
  put(b, &n, data, strlen(data));
  put32(b, &n, 0);    /* map */
  put64(b, &n, pos);  /* psize */
  put64(b, &n, 4096); /* plen */
  b[n++] = 0;         /* lost */
  put64(b, &n, n);
  put32(b, &n, ferry_crc32c(0, b, n));
  FILE *f = fopen(index, "wb");
  REQUIRE(f && fwrite(b, 1, n, f) == n && fclose(f) == 0);
  ferry_swap_config c = ferry_swap_config_default();
  c.force_buffered = 1;
  c.keep_files = 1;
  ferry_swap *s = NULL;
  EXPECT_EQ_INT(ferry_swap_reopen(&c, index, &s), FERRY_ECORRUPT);
  printf("crafted geometry: %s\n", ferry_last_error());
  EXPECT(strstr(ferry_last_error(), index) && strstr(ferry_last_error(), "geometry"));
  EXPECT(s == NULL);
  ferry_swap_close(s);
  unlink(index);
  unlink(data);
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "reopen", dir, sizeof dir);
  char d[3][1200];
  for (int i = 0; i < 3; i++) nt_subdir(dir, i, d[i], sizeof d[i]);

  ferry_swap_config c = ferry_swap_config_default();
  for (int i = 0; i < 3; i++) c.paths[i] = d[i];
  c.npaths = 3;
  c.slot_size = 2 << 20;
  c.nslots = NS + 2; /* the last two never written */
  c.spare_slots = 2;
  c.block_size = 256 << 10;
  c.keep_files = 1;
  ferry_swap *s = NULL;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  for (uint32_t i = 0; i < NS; i++) write_chunk(s, i, sizes[i], 10 + i);
  for (uint32_t i = 0; i < NS; i += 2) write_chunk(s, i, sizes[i], 20 + i); /* shadow rewrites */
  ferry_swap_info in;
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  char index[1200];
  snprintf(index, sizeof index, "%s", in.index_path);
  printf("index: %s\n", index);
  ferry_swap_close(s);
  EXPECT(access(index, F_OK) == 0);
  EXPECT_EQ_INT(nt_count_files(d[0]), 2); /* data file + index */
  EXPECT_EQ_INT(nt_count_files(d[1]), 1);

  /* reopen: geometry from the index, every chunk as written */
  ferry_swap_config rc = ferry_swap_config_default();
  rc.keep_files = 1;
  char keep[1300];
  snprintf(keep, sizeof keep, "%s.keep", index);
  copy_file(index, keep);
  REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
  EXPECT(access(index, F_OK) != 0); /* consumed: the store is live again */
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  EXPECT_EQ_INT((int)in.nslots, (int)(NS + 2));
  EXPECT_EQ_INT((int)in.slot_size, 2 << 20);
  EXPECT_EQ_INT((int)in.block_size, 256 << 10);
  for (uint32_t i = 0; i < NS; i++) {
    EXPECT_EQ_INT((int)ferry_swap_chunk_len(s, i), (int)sizes[i]);
    EXPECT_EQ_INT(check_chunk(s, i, sizes[i], (i % 2 ? 10 : 20) + i), FERRY_OK);
  }
  EXPECT_EQ_INT((int)ferry_swap_chunk_len(s, NS), 0);
  /* writes go on, spares included, and the next close saves again */
  for (uint32_t i = 1; i < NS; i += 2) write_chunk(s, i, sizes[i], 30 + i);
  write_chunk(s, NS + 1, 999, 77);
  EXPECT_EQ_INT(ferry_swap_save_index(s), FERRY_OK);
  EXPECT(access(index, F_OK) == 0);
  write_chunk(s, 0, sizes[0], 40); /* the saved index is stale now: deleted */
  EXPECT(access(index, F_OK) != 0);
  ferry_swap_close(s); /* writes a current one */
  EXPECT(access(index, F_OK) == 0);

  /* a bit flipped in a data file while closed is caught after reopening */
  REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
  EXPECT_EQ_INT(check_chunk(s, 0, sizes[0], 40), FERRY_OK);
  EXPECT_EQ_INT(check_chunk(s, NS + 1, 999, 77), FERRY_OK);
  for (uint32_t i = 1; i < NS; i++)
    EXPECT_EQ_INT(check_chunk(s, i, sizes[i], (i % 2 ? 30 : 20) + i), FERRY_OK);
  EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, 300000, 5), FERRY_OK);
  ferry_swap_close(s);
  REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
  EXPECT_EQ_INT(check_chunk(s, 3, sizes[3], 33), FERRY_ECORRUPT);
  EXPECT_EQ_INT(check_chunk(s, 2, sizes[2], 22), FERRY_OK);
  ferry_swap_close(s);
  copy_file(index, keep);

  /* refusals: each names what is wrong and leaves the files and index */
  flip_byte(index, 40);
  EXPECT_EQ_INT(ferry_swap_reopen(&rc, index, &s), FERRY_ECORRUPT);
  printf("damaged: %s\n", ferry_last_error());
  EXPECT(strstr(ferry_last_error(), index) && strstr(ferry_last_error(), "CRC32C"));
  EXPECT(s == NULL);
  EXPECT(access(index, F_OK) == 0);
  copy_file(keep, index);
  REQUIRE(truncate(index, 100) == 0);
  EXPECT_EQ_INT(ferry_swap_reopen(&rc, index, &s), FERRY_ECORRUPT);
  printf("truncated: %s\n", ferry_last_error());
  copy_file(keep, index);
  ferry_swap_config bad = rc;
  bad.slot_size = 1 << 20;
  EXPECT_EQ_INT(ferry_swap_reopen(&bad, index, &s), FERRY_EINVAL);
  printf("mismatch: %s\n", ferry_last_error());
  EXPECT(strstr(ferry_last_error(), "slot_size") != NULL);
  char missing[1300];
  snprintf(missing, sizeof missing, "%s/nope.index", d[0]);
  EXPECT_EQ_INT(ferry_swap_reopen(&rc, missing, &s), FERRY_ENOENT);
  EXPECT(strstr(ferry_last_error(), missing) != NULL);
  /* a data file gone or resized */
  char data1[1300], moved[1400];
  {
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "ls %s/ferry-swap-*.swap > %s/list", d[1], dir);
    REQUIRE(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/list", dir);
    FILE *f = fopen(cmd, "r");
    REQUIRE(f && fgets(data1, sizeof data1, f));
    fclose(f);
    unlink(cmd);
    data1[strcspn(data1, "\n")] = 0;
  }
  snprintf(moved, sizeof moved, "%s.moved", data1);
  REQUIRE(rename(data1, moved) == 0);
  EXPECT_EQ_INT(ferry_swap_reopen(&rc, index, &s), FERRY_ENOENT);
  printf("missing file: %s\n", ferry_last_error());
  EXPECT(strstr(ferry_last_error(), data1) != NULL);
  EXPECT(access(moved, F_OK) == 0 && access(index, F_OK) == 0);
  REQUIRE(rename(moved, data1) == 0);
  struct stat st;
  REQUIRE(stat(data1, &st) == 0);
  copy_file(data1, moved);
  REQUIRE(truncate(data1, st.st_size - 4096) == 0);
  EXPECT_EQ_INT(ferry_swap_reopen(&rc, index, &s), FERRY_ECORRUPT);
  printf("resized: %s\n", ferry_last_error());
  EXPECT(strstr(ferry_last_error(), data1) != NULL);
  REQUIRE(rename(moved, data1) == 0);

  /* finally a reopen without keep_files removes everything at close */
  rc.keep_files = 0;
  REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
  EXPECT_EQ_INT(check_chunk(s, 2, sizes[2], 22), FERRY_OK);
  ferry_swap_close(s);
  unlink(keep);
  for (int i = 0; i < 3; i++) EXPECT_EQ_INT(nt_count_files(d[i]), 0);
  crafted_geometry(d[0]);
  nt_cleanup(dir, 3);
  return test_finish("nvme.reopen");
}
