/* nvme/swap_index.c — the index of a store whose files are kept: what
 * ferry_swap_reopen needs to use them again (geometry, file paths, chunk
 * map, bytes per slot, CRC per block, lost flags), in one file guarded by
 * its own CRC32C and replaced atomically (temp file, fsync, rename).
 *
 * Layout (little-endian): "FERRYIX1", u32 version, u32 npaths, u64
 * slot_size, block, align, file_bytes, u32 nslots, spare, positions, cps,
 * ppf, nphys, direct, verify, tight; per file u32 length + path; u32
 * map[nslots]; u64 psize[nphys]; u64 plen[nphys]; u32 crc[nphys * cps];
 * u8 lost[nslots]; then u64 bytes
 * before it and u32 CRC32C of those bytes.
 */
#include "nvme/swap_impl.h"
#include "core/crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_MAGIC "FERRYIX1"
#define INDEX_VERSION 2u
#define INDEX_MAX_BYTES (1ull << 34) /* 16 GiB: far above any real index */

/* The index is sized exactly before it is written (encode_index): a cursor
 * into one allocation. */
typedef struct {
  unsigned char *p;
  size_t n;
} wbuf;

static void put(wbuf *b, const void *src, size_t len) {
  memcpy(b->p + b->n, src, len);
  b->n += len;
}
static void put32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put64(wbuf *b, uint64_t v) { put(b, &v, 8); }

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The data first: the index points at it. */
static int sync_files(ferry_swap *s) {
  for (int i = 0; i < s->npaths; i++)
    if (fdatasync(s->fds[i]) != 0) {
      int e = errno;
      return ferry_err(&s->err, FERRY_EIO, "swap '%s': fdatasync of %s: %s", s->name, s->files[i],
                       strerror(e));
    }
  return FERRY_OK;
}

static void put_geometry(wbuf *b, const ferry_swap *s) {
  put(b, INDEX_MAGIC, 8);
  put32(b, INDEX_VERSION);
  put32(b, (uint32_t)s->npaths);
  put64(b, s->cfg.slot_size);
  put64(b, s->bs);
  put64(b, s->oa);
  put64(b, s->file_bytes);
  put32(b, s->cfg.nslots);
  put32(b, s->cfg.spare_slots);
  put32(b, s->positions);
  put32(b, s->cps);
  put32(b, s->ppf);
  put32(b, s->nphys);
  put32(b, (uint32_t)s->direct);
  put32(b, (uint32_t)(s->cfg.verify != 0));
  put32(b, (uint32_t)s->tight);
}

/* The whole index, in one allocation sized first (b->p: the caller frees). */
static int encode_index(ferry_swap *s, wbuf *b) {
  /* absolute file paths: the store can be reopened from any directory */
  char (*abs)[PATH_MAX] = malloc((size_t)s->npaths * PATH_MAX);
  const char *path[FERRY_SWAP_MAX_PATHS];
  if (!abs) return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", s->name);
  size_t bytes = 8 + 2 * 4 + 4 * 8 + 9 * 4; /* magic, version+npaths, 4 u64, 9 u32 */
  for (int i = 0; i < s->npaths; i++) {
    path[i] = realpath(s->files[i], abs[i]) && strlen(abs[i]) < sizeof s->files[i] ? abs[i]
                                                                                   : s->files[i];
    bytes += 4 + strlen(path[i]);
  }
  bytes += (size_t)s->cfg.nslots * (sizeof *s->map + 1) + (size_t)s->nphys * 16 +
           (size_t)s->nphys * s->cps * sizeof *s->crc + 8 + 4;
  *b = (wbuf){malloc(bytes), 0};
  if (!b->p) {
    free(abs);
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for the index (%zu bytes)",
                     s->name, bytes);
  }
  put_geometry(b, s);
  for (int i = 0; i < s->npaths; i++) {
    uint32_t len = (uint32_t)strlen(path[i]);
    put32(b, len);
    put(b, path[i], len);
  }
  free(abs);
  put(b, s->map, (size_t)s->cfg.nslots * sizeof *s->map);
  for (uint32_t p = 0; p < s->nphys; p++) put64(b, s->psize[p]);
  for (uint32_t p = 0; p < s->nphys; p++) put64(b, s->plen[p]);
  put(b, s->crc, (size_t)s->nphys * s->cps * sizeof *s->crc);
  put(b, s->lost, s->cfg.nslots);
  put64(b, (uint64_t)b->n);
  put32(b, ferry_crc32c(0, b->p, b->n));
  FERRY_ASSERT(b->n == bytes, "swap index: wrote %zu bytes, sized %zu", b->n, bytes);
  return FERRY_OK;
}

/* Puts the index's bytes at s->index_path: a temp file, fsync, rename,
 * fsync of the directory. */
static int replace_index(ferry_swap *s, const wbuf *b) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", s->index_path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int rc = FERRY_OK;
  if (fd < 0 || write_all(fd, b->p, b->n) != 0 || fsync(fd) != 0) {
    int e = errno;
    rc = ferry_err(&s->err, e == ENOSPC ? FERRY_ENOSPC : FERRY_EIO,
                   "swap '%s': cannot write the index %s: %s", s->name, tmp, strerror(e));
  }
  if (fd >= 0) close(fd);
  if (rc == FERRY_OK && rename(tmp, s->index_path) != 0) {
    int e = errno;
    rc = ferry_err(&s->err, FERRY_EIO, "swap '%s': cannot rename %s to %s: %s", s->name, tmp,
                   s->index_path, strerror(e));
  }
  if (rc != FERRY_OK) {
    unlink(tmp);
    return rc;
  }
  int dfd = open(s->dirs[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename itself */
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return FERRY_OK;
}

int swap_index_save(ferry_swap *s) {
  int rc = sync_files(s);
  if (rc != FERRY_OK) return rc;
  wbuf b;
  rc = encode_index(s, &b);
  if (rc != FERRY_OK) return rc;
  rc = replace_index(s, &b);
  free(b.p);
  return rc;
}

/* ---- reading ----------------------------------------------------------- */

typedef struct {
  const unsigned char *p;
  size_t n, at;
  int bad;
} rbuf;

static void get(rbuf *r, void *dst, size_t len) {
  if (r->bad || len > r->n - r->at) {
    r->bad = 1;
    memset(dst, 0, len);
    return;
  }
  memcpy(dst, r->p + r->at, len);
  r->at += len;
}
static uint32_t get32(rbuf *r) {
  uint32_t v;
  get(r, &v, 4);
  return v;
}
static uint64_t get64(rbuf *r) {
  uint64_t v;
  get(r, &v, 8);
  return v;
}

void swap_saved_free(swap_saved *sv) {
  if (!sv) return;
  free(sv->map);
  free(sv->psize);
  free(sv->plen);
  free(sv->crc);
  free(sv->lost);
  memset(sv, 0, sizeof *sv);
}

static int damaged(ferry_errbuf *e, const char *path, const char *what) {
  return ferry_err(e, FERRY_ECORRUPT, "index %s is damaged: %s", path, what);
}

/* Reads the whole index file at path into *buf (n bytes; the caller
 * frees). */
static int read_index_file(const char *path, unsigned char **buf, size_t *n, ferry_errbuf *e) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int er = errno;
    return ferry_err(e, er == ENOENT ? FERRY_ENOENT : er == EACCES ? FERRY_EPERM : FERRY_EIO,
                     "cannot open the index %s: %s", path, strerror(er));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 12 ||
      (uint64_t)st.st_size > INDEX_MAX_BYTES) {
    close(fd);
    return damaged(e, path, "not a regular file of a plausible size");
  }
  *n = (size_t)st.st_size;
  *buf = malloc(*n);
  if (!*buf) {
    close(fd);
    return ferry_err(e, FERRY_ENOMEM, "out of memory reading the index %s", path);
  }
  size_t got = 0;
  while (got < *n) {
    ssize_t k = read(fd, *buf + got, *n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  if (got != *n) {
    free(*buf);
    return ferry_err(e, FERRY_EIO, "short read of the index %s (%zu of %zu bytes)", path, got, *n);
  }
  return FERRY_OK;
}

/* The magic, the length in the trailer and the CRC32C (n >= 12). */
static int check_trailer(const unsigned char *buf, size_t n, const char *path, ferry_errbuf *e) {
  uint64_t body;
  uint32_t want;
  memcpy(&body, buf + n - 12, 8);
  memcpy(&want, buf + n - 4, 4);
  uint32_t have = ferry_crc32c(0, buf, n - 4);
  char why[256];
  if (memcmp(buf, INDEX_MAGIC, 8) != 0) return damaged(e, path, "not a ferry swap index (magic)");
  if (body != n - 12) {
    snprintf(why, sizeof why, "%zu bytes, its trailer says %llu + 12 (truncated or extended)", n,
             (unsigned long long)body);
    return damaged(e, path, why);
  }
  if (have != want) {
    snprintf(why, sizeof why, "CRC32C expected 0x%08x, found 0x%08x", want, have);
    return damaged(e, path, why);
  }
  return FERRY_OK;
}

static void get_geometry(rbuf *r, swap_saved *sv) {
  sv->slot_size = get64(r);
  sv->bs = get64(r);
  sv->oa = get64(r);
  sv->file_bytes = get64(r);
  sv->nslots = get32(r);
  sv->spare_slots = get32(r);
  sv->positions = get32(r);
  sv->cps = get32(r);
  sv->ppf = get32(r);
  sv->nphys = get32(r);
  sv->direct = (int)get32(r);
  sv->verify = (int)get32(r);
  sv->tight = (int)get32(r);
}

/* The geometry must be the one ferry_swap_open derives, and the arrays fit
 * in the file's n bytes: NULL, or what is wrong. */
static const char *geometry_fault(const swap_saved *sv, uint32_t npaths, size_t n) {
  if (npaths < 1 || npaths > FERRY_SWAP_MAX_PATHS) return "file count";
  if (!sv->slot_size || !sv->nslots || !sv->bs || !sv->oa || sv->bs % sv->oa ||
      sv->bs > (1u << 30) || sv->oa > (1u << 16))
    return "sizes";
  /* in 64 bits, with open's limits (set_geometry): positions + 1 in 32
   * bits wraps to a cps of 0, no CRC entries for pieces that index them */
  uint64_t pos = sv->positions;
  if (pos >= UINT32_MAX || sv->nphys >= UINT32_MAX || sv->slot_size > UINT64_MAX - sv->bs ||
      pos != (sv->slot_size + sv->bs - 1) / sv->bs || (uint64_t)sv->cps != pos + 1 ||
      (uint64_t)sv->ppf != (pos + npaths - 1) / npaths ||
      (uint64_t)sv->nphys != (uint64_t)sv->nslots + sv->spare_slots || sv->tight > 1)
    return "geometry does not add up";
  if ((uint64_t)sv->nphys * sv->cps * 4 + (uint64_t)sv->nphys * 16 + (uint64_t)sv->nslots * 5 > n)
    return "arrays larger than the file";
  return NULL;
}

static const char *get_paths(rbuf *r, swap_saved *sv) {
  for (int i = 0; i < sv->npaths; i++) {
    uint32_t len = get32(r);
    if (len == 0 || len >= sizeof sv->files[i]) return "file path length";
    get(r, sv->files[i], len);
    sv->files[i][len] = 0;
  }
  return NULL;
}

/* Reads the arrays into sv (allocated here; *enomem when that failed):
 * NULL, or what is wrong. */
static const char *get_arrays(rbuf *r, swap_saved *sv, int *enomem) {
  sv->map = malloc((size_t)sv->nslots * sizeof *sv->map);
  sv->psize = malloc((size_t)sv->nphys * sizeof *sv->psize);
  sv->plen = malloc((size_t)sv->nphys * sizeof *sv->plen);
  sv->crc = malloc((size_t)sv->nphys * sv->cps * sizeof *sv->crc);
  sv->lost = malloc(sv->nslots);
  if (!sv->map || !sv->psize || !sv->plen || !sv->crc || !sv->lost) {
    *enomem = 1;
    return NULL;
  }
  get(r, sv->map, (size_t)sv->nslots * sizeof *sv->map);
  for (uint32_t p = 0; p < sv->nphys; p++) sv->psize[p] = get64(r);
  for (uint32_t p = 0; p < sv->nphys; p++) sv->plen[p] = get64(r);
  get(r, sv->crc, (size_t)sv->nphys * sv->cps * sizeof *sv->crc);
  get(r, sv->lost, sv->nslots);
  if (r->bad) return "truncated arrays";
  if (r->at != r->n) return "bytes after the arrays";
  return NULL;
}

/* Every slot holds 1..slot_size bytes (every slot slot_size unless
 * tight) and the slots add up to file_bytes; every chunk
 * maps to its own physical slot holding no more than it can: NULL, or
 * what is wrong. */
static const char *map_fault(const swap_saved *sv, uint32_t npaths) {
  const char *bad = NULL;
  uint64_t fb = 0;
  for (uint32_t p = 0; !bad && p < sv->nphys; p++) {
    uint64_t z = sv->psize[p];
    if (!z || z > sv->slot_size || (!sv->tight && z != sv->slot_size))
      bad = "slot sizes";
    else fb += swap_slot_height(z, sv->bs, sv->oa, npaths, sv->tight);
  }
  if (!bad && fb != sv->file_bytes) bad = "geometry does not add up";
  if (bad) return bad;
  unsigned char *seen = calloc(sv->nphys, 1);
  if (!seen) bad = "out of memory";
  for (uint32_t i = 0; seen && !bad && i < sv->nslots; i++) {
    uint32_t p = sv->map[i];
    if (p >= sv->nphys || seen[p] || sv->plen[p] > sv->psize[p]) bad = "chunk map";
    else seen[p] = 1;
  }
  free(seen);
  return bad;
}

/* Decodes a checked index of n bytes into sv (freed on failure). */
static int decode_index(const unsigned char *buf, size_t n, const char *path, swap_saved *sv,
                        ferry_errbuf *e) {
  rbuf r = {buf, n - 12, 8, 0};
  uint32_t version = get32(&r);
  if (version != INDEX_VERSION)
    return ferry_err(e, FERRY_ENOTSUP, "index %s has format version %u; this build reads %u",
                     path, version, INDEX_VERSION);
  uint32_t npaths = get32(&r);
  get_geometry(&r, sv);
  const char *bad = geometry_fault(sv, npaths, n);
  sv->npaths = (int)npaths;
  if (!bad) bad = get_paths(&r, sv);
  int enomem = 0;
  if (!bad) bad = get_arrays(&r, sv, &enomem);
  if (enomem) {
    swap_saved_free(sv);
    return ferry_err(e, FERRY_ENOMEM, "out of memory reading the index %s", path);
  }
  if (!bad) bad = map_fault(sv, npaths);
  if (bad) {
    swap_saved_free(sv);
    return damaged(e, path, bad);
  }
  return FERRY_OK;
}

int swap_index_load(const char *path, swap_saved *sv, ferry_errbuf *e) {
  memset(sv, 0, sizeof *sv);
  unsigned char *buf = NULL;
  size_t n = 0;
  int rc = read_index_file(path, &buf, &n, e);
  if (rc != FERRY_OK) return rc;
  rc = check_trailer(buf, n, path, e);
  if (rc == FERRY_OK) rc = decode_index(buf, n, path, sv, e);
  free(buf);
  return rc;
}
