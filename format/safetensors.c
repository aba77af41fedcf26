/* format/safetensors.c — safetensors files, the reader: a strict one (the
 * header's known shape walked with core/json.h's cursor, every offset, size
 * and name checked before any tensor byte is read), and sharded models
 * through model.safetensors.index.json. The writer is safetensors_write.c.
 */
#include "format/safetensors.h"
#include "core/dtype.h"

#include "core/file.h"
#include "core/json.h"
#include "core/untrusted.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- dtypes ---------------------------------------------------------------- */

/* Deprecated names of ferry_dtype_name and ferry_dtype_size (core/dtype.c). */
const char *ferry_st_dtype_name(ferry_dtype d) { return ferry_dtype_name(d); }
size_t ferry_st_dtype_size(ferry_dtype d) { return ferry_dtype_size(d); }

/* ---- the reader -------------------------------------------------------------- */

typedef struct {
  char *name;
  ferry_dtype dtype;
  int ndim;
  int64_t shape[FERRY_SAFETENSORS_MAX_DIMS];
  uint64_t numel, nbytes;
  uint64_t begin, end; /* data_offsets, relative to the data section */
  int shard;
  uint64_t offset; /* absolute */
} st_entry;

typedef struct {
  char *path;
  int fd;                   /* -1 for memory */
  const unsigned char *mem; /* whole file in memory, or NULL */
  uint64_t size;
} st_shard;

struct ferry_safetensors {
  ferry_errbuf err;
  st_shard *shards;
  int nshards;
  st_entry *t;
  size_t nt, capt;
  size_t *by_name; /* indices into t sorted by name */
  char **mkeys, **mvals;
  size_t nmeta;
};

static int st_push(ferry_safetensors *f, st_entry *e) {
  if (f->nt == f->capt) {
    size_t cap = f->capt ? f->capt * 2 : 64;
    st_entry *t = realloc(f->t, cap * sizeof *t);
    if (!t) return -1;
    f->t = t;
    f->capt = cap;
  }
  f->t[f->nt++] = *e;
  return 0;
}

/* ---- the header's JSON --------------------------------------------------------
 * Read with core/json.h's cursor. An error of JSON syntax reads "bad JSON at
 * byte N: what"; an error of the header's content (a tensor's fields, its
 * sizes) is written to `why` as it is. */

typedef struct {
  ferry_json_cur j;
  char why[256]; /* a content error, or "" */
  int oom;       /* the error is a failed allocation */
} hcur;

static void hcur_init(hcur *h, const char *text, size_t len) {
  ferry_json_init(&h->j, text, len);
  h->why[0] = '\0';
  h->oom = 0;
}

static int hfail(hcur *h, const char *fmt, ...) FERRY_PRINTF(2, 3);
static int hfail(hcur *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->why, sizeof h->why, fmt, ap);
  va_end(ap);
  return -1;
}

static int hoom(hcur *h) {
  h->oom = 1;
  return hfail(h, "out of memory");
}

/* The message of the error that stopped the reader. */
static const char *hwhy(hcur *h) {
  if (!h->why[0])
    snprintf(h->why, sizeof h->why, "bad JSON at byte %zu: %s",
             (size_t)((h->j.err_at ? h->j.err_at : h->j.p) - h->j.begin), h->j.why);
  return h->why;
}

static int parse_dtype(hcur *h, st_entry *e, const char *name) {
  char d[40];
  size_t dl;
  if (ferry_json_string(&h->j, d, sizeof d, &dl)) return -1;
  int dt = dl < sizeof d ? ferry_dtype_parse(d, dl) : -1;
  if (dt < 0) return hfail(h, "tensor '%.128s': unknown dtype '%.32s'", name, d);
  e->dtype = (ferry_dtype)dt;
  return 0;
}

static int parse_shape(hcur *h, st_entry *e, const char *name) {
  ferry_json_iter it;
  int more;
  e->ndim = 0;
  if (ferry_json_enter(&h->j, '[', &it)) return -1;
  while ((more = ferry_json_more(&h->j, &it)) == 1) {
    uint64_t v;
    if (ferry_json_u64(&h->j, &v)) return -1;
    if (e->ndim == FERRY_SAFETENSORS_MAX_DIMS)
      return hfail(h, "tensor '%.128s': more than %d dimensions", name, FERRY_SAFETENSORS_MAX_DIMS);
    if (v > (uint64_t)INT64_MAX)
      return hfail(h, "tensor '%.128s': dimension %llu too large", name, (unsigned long long)v);
    e->shape[e->ndim++] = (int64_t)v;
  }
  return more;
}

/* "data_offsets": exactly [begin, end]. */
static int parse_offsets(hcur *h, st_entry *e) {
  ferry_json_cur *j = &h->j;
  return ferry_json_expect(j, '[') || ferry_json_u64(j, &e->begin) || ferry_json_expect(j, ',') ||
                 ferry_json_u64(j, &e->end) || ferry_json_expect(j, ']')
             ? -1
             : 0;
}

/* One tensor's object: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static int parse_tensor(hcur *h, st_entry *e, const char *name) {
  static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
  int seen[3] = {0, 0, 0}, more;
  ferry_json_iter it;
  if (ferry_json_enter(&h->j, '{', &it)) return -1;
  if (ferry_json_peek(&h->j) == '}') return ferry_json_fail(&h->j, "empty tensor entry");
  while ((more = ferry_json_more(&h->j, &it)) == 1) {
    char k[72];
    size_t kl;
    int f = 0;
    if (ferry_json_string(&h->j, k, sizeof k, &kl) || ferry_json_expect(&h->j, ':')) return -1;
    while (f < 3 && (kl >= sizeof k || strcmp(k, fields[f]) != 0)) f++;
    if (f == 3) return hfail(h, "tensor '%.128s': unknown field '%.64s'", name, k);
    if (seen[f]++) return ferry_json_fail(&h->j, "\"%s\" given twice", fields[f]);
    if (f == 0 ? parse_dtype(h, e, name) : f == 1 ? parse_shape(h, e, name) : parse_offsets(h, e))
      return -1;
  }
  if (more < 0) return -1;
  for (int f = 0; f < 3; f++)
    if (!seen[f]) return hfail(h, "tensor '%.128s': missing \"%s\"", name, fields[f]);
  return 0;
}

/* Keeps one metadata pair (taking k and v, freed on failure). */
static int metadata_add(hcur *h, ferry_safetensors *f, char *k, char *v) {
  for (size_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->mkeys[i], k) == 0) {
      hfail(h, "__metadata__: key '%.128s' given twice", k);
      free(k);
      free(v);
      return -1;
    }
  char **nk = realloc(f->mkeys, (f->nmeta + 1) * sizeof *nk);
  if (nk) f->mkeys = nk;
  char **nv = realloc(f->mvals, (f->nmeta + 1) * sizeof *nv);
  if (nv) f->mvals = nv;
  if (!nk || !nv) {
    free(k);
    free(v);
    return hoom(h);
  }
  f->mkeys[f->nmeta] = k;
  f->mvals[f->nmeta++] = v;
  return 0;
}

/* "__metadata__": null or {string: string}; kept when `keep`. */
static int parse_metadata(hcur *h, ferry_safetensors *f, int keep) {
  ferry_json_iter it;
  int more;
  if (ferry_json_peek(&h->j) == 'n') return ferry_json_skip(&h->j);
  if (ferry_json_enter(&h->j, '{', &it)) return -1;
  while ((more = ferry_json_more(&h->j, &it)) == 1) {
    char *k, *v;
    if (ferry_json_strdup(&h->j, &k, NULL)) return -1;
    if (ferry_json_expect(&h->j, ':') || ferry_json_strdup(&h->j, &v, NULL)) {
      free(k);
      return -1;
    }
    if (keep) {
      if (metadata_add(h, f, k, v)) return -1;
    } else {
      free(k);
      free(v);
    }
  }
  return more;
}

static int cmp_begin(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* The header object: its tensors appended to f, its metadata kept for shard 0. */
static int read_header_json(hcur *h, ferry_safetensors *f, int shard) {
  ferry_json_cur *j = &h->j;
  ferry_json_iter it;
  int more, have_meta = 0;
  if (ferry_json_peek(j) != '{') return ferry_json_fail(j, "header does not start with '{'");
  if (ferry_json_enter(j, '{', &it)) return -1;
  while ((more = ferry_json_more(j, &it)) == 1) {
    char *name;
    if (ferry_json_strdup(j, &name, NULL)) return -1;
    if (ferry_json_expect(j, ':')) {
      free(name);
      return -1;
    }
    if (strcmp(name, "__metadata__") == 0) {
      free(name);
      if (have_meta++) return ferry_json_fail(j, "__metadata__ given twice");
      if (parse_metadata(h, f, shard == 0)) return -1;
      continue;
    }
    st_entry e = {.name = name, .shard = shard};
    int rc = parse_tensor(h, &e, name);
    if (!rc && st_push(f, &e)) rc = hoom(h);
    if (rc) {
      free(name);
      return -1;
    }
  }
  if (more < 0) return -1;
  if (!ferry_json_at_end(j)) return ferry_json_fail(j, "trailing bytes after the header object");
  return 0;
}

/* Each tensor from `first` on: its size from shape and dtype (without
 * overflow) against its data_offsets and the data section of data_len bytes;
 * its absolute offset after a header of hdr_len bytes. */
static int check_sizes(hcur *h, ferry_safetensors *f, size_t first, uint64_t hdr_len,
                       uint64_t data_len) {
  for (size_t i = first; i < f->nt; i++) {
    st_entry *e = &f->t[i];
    uint64_t numel = 1;
    int over = 0;
    for (int d = 0; d < e->ndim; d++) {
      uint64_t s = (uint64_t)e->shape[d];
      if (s && numel > UINT64_MAX / s) over = 1;
      numel *= s;
    }
    size_t es = ferry_dtype_size(e->dtype);
    if (!over && numel > UINT64_MAX / es) over = 1;
    if (over) return hfail(h, "tensor '%.128s': shape overflows 64 bits", e->name);
    e->numel = numel;
    e->nbytes = numel * es;
    unsigned long long b = e->begin, en = e->end;
    if (e->end < e->begin)
      return hfail(h, "tensor '%.128s': data_offsets [%llu, %llu] end before begin", e->name, b,
                   en);
    if (e->end - e->begin != e->nbytes)
      return hfail(h,
                   "tensor '%.128s': data_offsets [%llu, %llu] hold %llu bytes but shape x %s "
                   "needs %llu",
                   e->name, b, en, en - b, ferry_dtype_name(e->dtype),
                   (unsigned long long)e->nbytes);
    if (e->end > data_len)
      return hfail(h,
                   "tensor '%.128s': data_offsets [%llu, %llu] past the end of the data (%llu "
                   "bytes: truncated file?)",
                   e->name, b, en, (unsigned long long)data_len);
    e->offset = 8 + hdr_len + e->begin;
  }
  return 0;
}

/* The tensors from `first` on, put in file order, tile the data section:
 * no overlap, no hole, nothing after. */
static int check_tiling(hcur *h, ferry_safetensors *f, size_t first, uint64_t data_len) {
  if (f->nt > first) qsort(f->t + first, f->nt - first, sizeof *f->t, cmp_begin);
  uint64_t at = 0;
  for (size_t i = first; i < f->nt; i++) {
    st_entry *e = &f->t[i];
    if (e->begin < at && strcmp(e->name, f->t[i - 1].name) == 0) /* not an overlap with itself */
      return hfail(h, "tensor '%.128s' appears twice", e->name);
    if (e->begin < at)
      return hfail(h, "tensor '%.128s': data_offsets [%llu, %llu] overlap '%.128s'", e->name,
                   (unsigned long long)e->begin, (unsigned long long)e->end, f->t[i - 1].name);
    if (e->begin > at)
      return hfail(h, "tensor '%.128s': hole of %llu bytes before its data", e->name,
                   (unsigned long long)(e->begin - at));
    at = e->end;
  }
  if (at != data_len)
    return hfail(h, "%llu bytes after the last tensor's data", (unsigned long long)(data_len - at));
  return 0;
}

/* Parses one file's header (hdr, n bytes) and checks every tensor against
 * the data section of `data_len` bytes; appends its tensors to f. */
static int parse_header(ferry_safetensors *f, int shard, const char *hdr, uint64_t n,
                        uint64_t data_len) {
  hcur h;
  hcur_init(&h, hdr, n);
  size_t first = f->nt;
  if (read_header_json(&h, f, shard) || check_sizes(&h, f, first, n, data_len) ||
      check_tiling(&h, f, first, data_len))
    return ferry_err(&f->err, FERRY_ECORRUPT, "%s: %s", f->shards[shard].path, hwhy(&h));
  return 0;
}
static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
  unsigned char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return 1; /* EOF */
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

/* Where a model's files are opened from: below root (sub: the model's
 * folder below it, "" for root itself), each name offered to allow first;
 * a NULL st_from: the file the user named, followed as given. */
typedef struct {
  const char *root, *sub;
  st_allow_fn allow;
  void *ctx;
} st_from;

/* sub/name below from's root into rel. */
static int from_rel(const st_from *from, const char *name, char *rel, size_t cap) {
  int n = snprintf(rel, cap, "%s%s%s", from->sub, from->sub[0] ? "/" : "", name);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Opens the file name of from (or path, the user's, when from is NULL)
 * through core/untrusted.h, after allow agreed to its name. */
static int from_open(const st_from *from, const char *path, const char *name, uint64_t max,
                     int *fd, uint64_t *size, char *why, size_t wl) {
  char rel[4096];
  if (!from) return ferry_open_named(path, max, fd, size, why, wl);
  if (from_rel(from, name, rel, sizeof rel)) {
    snprintf(why, wl, "%s: path too long", path);
    return FERRY_EOVERFLOW;
  }
  char no[256], shown[1024];
  int rc = from->allow ? from->allow(from->ctx, rel, no, sizeof no) : 0;
  if (rc) /* refused by its name: never opened */
    snprintf(why, wl, "%.400s/%.400s: %.100s", from->root,
             ferry_escape(rel, shown, sizeof shown), no);
  return rc ? rc : ferry_open_untrusted(from->root, rel, max, fd, size, why, wl);
}

/* Opens (the file `name` of from, or sh->path when from is NULL) and
 * parses one file into shard slot s (path already set). */
static int open_shard(ferry_safetensors *f, int s, const st_from *from, const char *name) {
  st_shard *sh = &f->shards[s];
  unsigned char len8[8];
  if (!sh->mem) {
    char why[1024];
    int rc = from_open(from, sh->path, name, FERRY_MAX_ANY, &sh->fd, &sh->size, why, sizeof why);
    if (rc) return ferry_err(&f->err, rc, "%s", why);
  }
  if (sh->size < 8)
    return ferry_err(&f->err, FERRY_ECORRUPT, "%s: %llu bytes, shorter than the 8-byte header length",
                     sh->path, (unsigned long long)sh->size);
  if (sh->mem) {
    memcpy(len8, sh->mem, 8);
  } else {
    int r = pread_full(sh->fd, len8, 8, 0);
    if (r) return ferry_err(&f->err, FERRY_EIO, "%s: reading the header length failed", sh->path);
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n < 2 || n > FERRY_ST_MAX_HEADER)
    return ferry_err(&f->err, FERRY_ECORRUPT,
                     "%s: header length %llu out of range (2 to %u bytes)", sh->path,
                     (unsigned long long)n, FERRY_ST_MAX_HEADER);
  if (n > sh->size - 8)
    return ferry_err(&f->err, FERRY_ECORRUPT,
                     "%s: header of %llu bytes runs past the end of the %llu-byte file", sh->path,
                     (unsigned long long)n, (unsigned long long)sh->size);
  const char *hdr;
  char *buf = NULL;
  if (sh->mem) {
    hdr = (const char *)sh->mem + 8;
  } else {
    buf = malloc(n);
    if (!buf) return ferry_err(&f->err, FERRY_ENOMEM, "%s: header of %llu bytes", sh->path,
                               (unsigned long long)n);
    if (pread_full(sh->fd, buf, n, 8)) {
      free(buf);
      return ferry_err(&f->err, FERRY_EIO, "%s: reading the header failed", sh->path);
    }
    hdr = buf;
  }
  int rc = parse_header(f, s, hdr, n, sh->size - 8 - n);
  free(buf);
  return rc;
}

static int cmp_name_idx_r(const void *a, const void *b, void *ctx) {
  const ferry_safetensors *f = ctx;
  return strcmp(f->t[*(const size_t *)a].name, f->t[*(const size_t *)b].name);
}

/* Builds the name index and refuses duplicate names. */
static int build_index(ferry_safetensors *f) {
  f->by_name = malloc((f->nt ? f->nt : 1) * sizeof *f->by_name);
  if (!f->by_name) return ferry_err(&f->err, FERRY_ENOMEM, "out of memory");
  for (size_t i = 0; i < f->nt; i++) f->by_name[i] = i;
  if (f->nt) qsort_r(f->by_name, f->nt, sizeof *f->by_name, cmp_name_idx_r, f);
  for (size_t i = 1; i < f->nt; i++) {
    const st_entry *a = &f->t[f->by_name[i - 1]], *b = &f->t[f->by_name[i]];
    if (strcmp(a->name, b->name) == 0)
      return ferry_err(&f->err, FERRY_ECORRUPT, "tensor '%.200s' appears twice (%s and %s)",
                       a->name, f->shards[a->shard].path, f->shards[b->shard].path);
  }
  return 0;
}

static void st_free(ferry_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->nshards; i++) {
    if (f->shards[i].fd >= 0) close(f->shards[i].fd);
    free(f->shards[i].path);
  }
  free(f->shards);
  for (size_t i = 0; i < f->nt; i++) free(f->t[i].name);
  free(f->t);
  free(f->by_name);
  for (size_t i = 0; i < f->nmeta; i++) {
    free(f->mkeys[i]);
    free(f->mvals[i]);
  }
  free(f->mkeys);
  free(f->mvals);
  ferry_errbuf_destroy(&f->err);
  free(f);
}

static ferry_safetensors *st_new(int nshards) {
  ferry_safetensors *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  ferry_errbuf_init(&f->err);
  f->shards = calloc((size_t)nshards, sizeof *f->shards);
  if (!f->shards) {
    st_free(f);
    return NULL;
  }
  f->nshards = nshards;
  for (int i = 0; i < nshards; i++) f->shards[i].fd = -1;
  return f;
}

/* The reader's error as the thread's, names from the file escaped
 * (core/untrusted.h): a message about a file may be shown on a terminal. */
static int st_fail(ferry_safetensors *f, int rc, ferry_safetensors **out) {
  char shown[1024];
  ferry_err_thread(rc, "safetensors: %s", ferry_escape(ferry_err_msg(&f->err), shown, sizeof shown));
  st_free(f);
  *out = NULL;
  return rc;
}

int ferry_safetensors_open_memory(const void *data, size_t len, ferry_safetensors **out) {
  if (!out) return ferry_err_thread(FERRY_EINVAL, "safetensors: out is NULL");
  *out = NULL;
  if (!data && len) return ferry_err_thread(FERRY_EINVAL, "safetensors: data is NULL");
  ferry_safetensors *f = st_new(1);
  if (!f || !(f->shards[0].path = strdup("<memory>"))) {
    st_free(f);
    return ferry_err_thread(FERRY_ENOMEM, "safetensors: out of memory");
  }
  static const unsigned char empty[1];
  f->shards[0].mem = data ? data : empty;
  f->shards[0].size = len;
  int rc = open_shard(f, 0, NULL, NULL);
  if (!rc) rc = build_index(f);
  if (rc) return st_fail(f, rc, out);
  *out = f;
  return 0;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

char *st_path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

/* ---- sharded models: model.safetensors.index.json ----------------------------- */

typedef struct {
  char *name, *file;
} wm_entry;

/* The index's "weight_map": tensor name to shard file. */
typedef struct {
  wm_entry *e;
  size_t n, cap;
} weight_map;

static void wm_free(weight_map *w) {
  for (size_t i = 0; i < w->n; i++) {
    free(w->e[i].name);
    free(w->e[i].file);
  }
  free(w->e);
}

static int cmp_wm(const void *a, const void *b) {
  return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "weight_map": {name: file, ...}. */
static int read_weight_map(hcur *h, weight_map *w) {
  ferry_json_cur *j = &h->j;
  ferry_json_iter it;
  int more;
  if (ferry_json_enter(j, '{', &it)) return -1;
  while ((more = ferry_json_more(j, &it)) == 1) {
    wm_entry e = {0};
    if (ferry_json_strdup(j, &e.name, NULL) || ferry_json_expect(j, ':') ||
        ferry_json_strdup(j, &e.file, NULL)) {
      free(e.name);
      return -1;
    }
    if (w->n == w->cap) {
      size_t cap = w->cap ? w->cap * 2 : 256;
      wm_entry *n2 = realloc(w->e, cap * sizeof *n2);
      if (!n2) {
        free(e.name);
        free(e.file);
        return hoom(h);
      }
      w->e = n2;
      w->cap = cap;
    }
    w->e[w->n++] = e;
  }
  return more;
}

/* The index object: its "weight_map"; other keys ("metadata") are skipped. */
static int read_index(hcur *h, weight_map *w) {
  ferry_json_cur *j = &h->j;
  ferry_json_iter it;
  int more, have_wm = 0;
  if (ferry_json_enter(j, '{', &it)) return -1;
  while ((more = ferry_json_more(j, &it)) == 1) {
    char k[16];
    size_t kl;
    if (ferry_json_string(j, k, sizeof k, &kl) || ferry_json_expect(j, ':')) return -1;
    if (kl >= sizeof k || strcmp(k, "weight_map") != 0) {
      if (ferry_json_skip(j)) return -1;
      continue;
    }
    if (have_wm++) return ferry_json_fail(j, "weight_map given twice");
    if (read_weight_map(h, w)) return -1;
  }
  if (more < 0) return -1;
  if (!ferry_json_at_end(j)) return ferry_json_fail(j, "trailing bytes");
  if (!have_wm) return hfail(h, "no \"weight_map\"");
  return 0;
}

/* Sorts the map by name; refuses a name twice and a file that is not a plain
 * name in the index's folder. */
static int check_weight_map(hcur *h, weight_map *w) {
  if (w->n) qsort(w->e, w->n, sizeof *w->e, cmp_wm);
  for (size_t i = 0; i < w->n; i++) {
    const wm_entry *e = &w->e[i];
    if (i && strcmp(e->name, w->e[i - 1].name) == 0)
      return hfail(h, "weight_map: tensor '%.200s' given twice", e->name);
    if (!e->file[0] || strchr(e->file, '/') || strcmp(e->file, "..") == 0 ||
        strcmp(e->file, ".") == 0)
      return hfail(h, "weight_map: tensor '%.200s': file '%.100s' is not a plain file name in the "
                      "index's folder", e->name, e->file);
  }
  return 0;
}

/* The distinct files of the map, sorted (pointers into the map). */
static int list_files(hcur *h, const weight_map *w, char ***files, size_t *nfiles) {
  char **fl = malloc((w->n ? w->n : 1) * sizeof *fl);
  if (!fl) return hoom(h);
  for (size_t i = 0; i < w->n; i++) fl[i] = w->e[i].file;
  if (w->n) qsort(fl, w->n, sizeof *fl, cmp_str);
  size_t n = 0;
  for (size_t i = 0; i < w->n; i++)
    if (!n || strcmp(fl[n - 1], fl[i]) != 0) fl[n++] = fl[i];
  *files = fl;
  *nfiles = n;
  if (n > 100000) return hfail(h, "weight_map names %zu files", n);
  return 0;
}

/* A reader with one shard per file, each in the folder of `index` (opened
 * through from), indexed by name. *out is NULL when memory ran out before
 * that; otherwise it holds the reader, with its error when the status is
 * not 0. */
static int open_shards(const char *index, const st_from *from, char **files, size_t nfiles,
                       ferry_safetensors **out) {
  ferry_safetensors *f = st_new(nfiles ? (int)nfiles : 1);
  char *dir = strdup(index);
  *out = NULL;
  if (!f || !dir) goto oom;
  if (!nfiles) f->nshards = 0;
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else strcpy(dir, ".");
  for (size_t i = 0; i < nfiles; i++)
    if (!(f->shards[i].path = st_path_join(dir, files[i]))) goto oom;
  free(dir);
  *out = f;
  for (size_t i = 0; i < nfiles; i++) {
    int rc = open_shard(f, (int)i, from, files[i]);
    if (rc) return rc;
  }
  return build_index(f);
oom:
  free(dir);
  st_free(f);
  return FERRY_ENOMEM;
}

/* The weight_map and the shards agree exactly: every mapped tensor is in the
 * file it is mapped to, and the shards hold nothing else. */
static int match_weight_map(ferry_safetensors *f, const char *path, const weight_map *w) {
  for (size_t i = 0; i < w->n; i++) {
    const wm_entry *m = &w->e[i];
    size_t lo = 0, hi = f->nt;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (strcmp(f->t[f->by_name[mid]].name, m->name) < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo == f->nt || strcmp(f->t[f->by_name[lo]].name, m->name) != 0)
      return ferry_err(&f->err, FERRY_ECORRUPT, "%s: tensor '%.200s' is in the weight_map but "
                       "not in %s", path, m->name, m->file);
    const char *sp = f->shards[f->t[f->by_name[lo]].shard].path;
    if (!ends_with(sp, m->file) || sp[strlen(sp) - strlen(m->file) - 1] != '/')
      return ferry_err(&f->err, FERRY_ECORRUPT, "%s: tensor '%.200s' is mapped to %s but found "
                       "in %s", path, m->name, m->file, sp);
  }
  if (f->nt != w->n)
    return ferry_err(&f->err, FERRY_ECORRUPT, "%s: the shards hold %zu tensors but the "
                     "weight_map names %zu", path, f->nt, w->n);
  return 0;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {name:
 * file}}: the file name of from, or path (the user's) when from is NULL,
 * whose shards are then opened below path's folder. */
static int open_index(const char *path, const st_from *from, const char *name,
                      ferry_safetensors **out) {
  char why[1024] = "", *text = NULL;
  size_t len = 0;
  int fd;
  uint64_t size;
  int rc = from_open(from, path, name, FERRY_MAX_ST_INDEX, &fd, &size, why, sizeof why);
  if (!rc) rc = ferry_read_fd(fd, path, size, FERRY_MAX_ST_INDEX, &text, &len, why, sizeof why);
  if (rc) return ferry_err_thread(rc == FERRY_EOVERFLOW ? FERRY_ECORRUPT : rc, "safetensors: %s",
                                  why);
  hcur h;
  hcur_init(&h, text, len);
  weight_map w = {0};
  char **files = NULL;
  size_t nfiles = 0;
  ferry_safetensors *f = NULL;
  if (read_index(&h, &w) || check_weight_map(&h, &w) || list_files(&h, &w, &files, &nfiles)) {
    char shown[600];
    rc = ferry_err_thread(h.oom ? FERRY_ENOMEM : FERRY_ECORRUPT, "safetensors: %s: %s", path,
                          ferry_escape(hwhy(&h), shown, sizeof shown));
  } else {
    /* an index the user named: its shards are below its folder */
    char *dir = from ? NULL : strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
    st_from here = {slash == dir ? "/" : slash ? dir : ".", "", NULL, NULL};
    if (slash) *slash = '\0';
    if (from || dir) rc = open_shards(path, from ? from : &here, files, nfiles, &f);
    else rc = FERRY_ENOMEM;
    free(dir);
    if (!rc) rc = match_weight_map(f, path, &w);
    if (!f) rc = ferry_err_thread(rc, "safetensors: %s: out of memory", path);
    else if (rc) rc = st_fail(f, rc, &f);
  }
  wm_free(&w);
  free(files);
  free(text);
  *out = f;
  return rc;
}

/* Whether the file name of from is there: allow's answer, or (no allow)
 * whether anything of that name is in the folder (a link is found, then
 * refused when it is opened). */
static int from_has(const st_from *from, const char *name) {
  char rel[4096], p[8400], why[8];
  struct stat st;
  if (from_rel(from, name, rel, sizeof rel)) return 0;
  if (from->allow) return from->allow(from->ctx, rel, why, sizeof why) == 0;
  int n = snprintf(p, sizeof p, "%s/%s", from->root, rel);
  return n > 0 && (size_t)n < sizeof p && lstat(p, &st) == 0;
}

/* One model.safetensors: the file name of from, or path (the user's). */
static int open_one(const char *path, const st_from *from, const char *name,
                    ferry_safetensors **out) {
  ferry_safetensors *f = st_new(1);
  if (!f || !(f->shards[0].path = strdup(path))) {
    st_free(f);
    return ferry_err_thread(FERRY_ENOMEM, "safetensors: out of memory");
  }
  int rc = open_shard(f, 0, from, name);
  if (!rc) rc = build_index(f);
  if (rc) return st_fail(f, rc, out);
  *out = f;
  return 0;
}

int st_open_below(const char *root, const char *sub, st_allow_fn allow, void *ctx,
                  ferry_safetensors **out) {
  static const char idx[] = "model.safetensors.index.json", one[] = "model.safetensors";
  st_from from = {root, sub ? sub : "", allow, ctx};
  *out = NULL;
  char *folder = st_path_join(root, from.sub), *p = NULL;
  int rc;
  if (folder && from.sub[0] == '\0') folder[strlen(folder) - 1] = '\0'; /* no trailing '/' */
  if (!folder) {
    rc = ferry_err_thread(FERRY_ENOMEM, "safetensors: out of memory");
  } else if (from_has(&from, idx)) {
    rc = (p = st_path_join(folder, idx)) ? open_index(p, &from, idx, out) : FERRY_ENOMEM;
  } else if (from_has(&from, one)) {
    rc = (p = st_path_join(folder, one)) ? open_one(p, &from, one, out) : FERRY_ENOMEM;
  } else {
    rc = ferry_err_thread(FERRY_ENOENT, "safetensors: %s holds neither %s nor %s", folder, idx,
                          one);
  }
  if (rc == FERRY_ENOMEM && !p) ferry_err_thread(rc, "safetensors: out of memory");
  free(folder);
  free(p);
  return rc;
}

int ferry_safetensors_open(const char *path, ferry_safetensors **out) {
  if (!out) return ferry_err_thread(FERRY_EINVAL, "safetensors: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return ferry_err_thread(FERRY_EINVAL, "safetensors: no path");
  struct stat st;
  if (stat(path, &st) != 0)
    return ferry_err_thread(errno == ENOENT ? FERRY_ENOENT : FERRY_EIO, "safetensors: %s: %s",
                            path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return st_open_below(path, "", NULL, NULL, out);
  if (ends_with(path, ".json")) return open_index(path, NULL, NULL, out);
  return open_one(path, NULL, NULL, out);
}

void ferry_safetensors_close(ferry_safetensors *f) { st_free(f); }

const char *ferry_safetensors_last_error(const ferry_safetensors *f) {
  return f ? ferry_err_msg(&f->err) : "";
}

size_t ferry_safetensors_count(const ferry_safetensors *f) { return f ? f->nt : 0; }

static void fill_info(const st_entry *e, ferry_safetensors_tensor *o) {
  o->name = e->name;
  o->dtype = e->dtype;
  o->ndim = e->ndim;
  memset(o->shape, 0, sizeof o->shape);
  memcpy(o->shape, e->shape, (size_t)e->ndim * sizeof e->shape[0]);
  o->numel = e->numel;
  o->nbytes = e->nbytes;
  o->shard = e->shard;
  o->offset = e->offset;
}

int ferry_safetensors_get(const ferry_safetensors *f, size_t i, ferry_safetensors_tensor *out) {
  if (!f || !out) return FERRY_EINVAL;
  if (i >= f->nt)
    return ferry_err((ferry_errbuf *)&f->err, FERRY_EINVAL, "tensor index %zu of %zu", i, f->nt);
  fill_info(&f->t[i], out);
  return 0;
}

int ferry_safetensors_find(const ferry_safetensors *f, const char *name, ferry_safetensors_tensor *out,
                           size_t *index) {
  if (!f || !name) return FERRY_EINVAL;
  size_t lo = 0, hi = f->nt;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(f->t[f->by_name[mid]].name, name);
    if (c == 0) {
      if (out) fill_info(&f->t[f->by_name[mid]], out);
      if (index) *index = f->by_name[mid];
      return 0;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return ferry_err((ferry_errbuf *)&f->err, FERRY_ENOENT, "no tensor '%.200s'", name);
}

int ferry_safetensors_read(ferry_safetensors *f, size_t i, uint64_t offset, void *buf,
                           size_t bytes) {
  if (!f || (!buf && bytes)) return FERRY_EINVAL;
  if (i >= f->nt) return ferry_err(&f->err, FERRY_EINVAL, "tensor index %zu of %zu", i, f->nt);
  const st_entry *e = &f->t[i];
  /* names from a file (an index names the shards), escaped: a message may reach a terminal */
  char shown[256], path[1024];
  if (offset > e->nbytes || bytes > e->nbytes - offset)
    return ferry_err(&f->err, FERRY_EINVAL,
                     "tensor '%.200s': read of %zu bytes at %llu past its %llu bytes",
                     ferry_escape(e->name, shown, sizeof shown), bytes, (unsigned long long)offset,
                     (unsigned long long)e->nbytes);
  if (!bytes) return 0;
  const st_shard *sh = &f->shards[e->shard];
  if (sh->mem) {
    memcpy(buf, sh->mem + e->offset + offset, bytes);
    return 0;
  }
  int r = pread_full(sh->fd, buf, bytes, e->offset + offset);
  if (r == 1)
    return ferry_err(&f->err, FERRY_ECORRUPT,
                     "%s: tensor '%.200s': file ended early (truncated "
                     "since it was opened)",
                     ferry_escape(sh->path, path, sizeof path),
                     ferry_escape(e->name, shown, sizeof shown));
  if (r)
    return ferry_err(&f->err, FERRY_EIO, "%s: tensor '%.200s': read: %s",
                     ferry_escape(sh->path, path, sizeof path),
                     ferry_escape(e->name, shown, sizeof shown), strerror(-r));
  return 0;
}

size_t ferry_safetensors_metadata_count(const ferry_safetensors *f) { return f ? f->nmeta : 0; }

int ferry_safetensors_metadata_get(const ferry_safetensors *f, size_t i, const char **key,
                                   const char **value) {
  if (!f || i >= f->nmeta) return FERRY_EINVAL;
  if (key) *key = f->mkeys[i];
  if (value) *value = f->mvals[i];
  return 0;
}

const char *ferry_safetensors_metadata_find(const ferry_safetensors *f, const char *key) {
  if (!f || !key) return NULL;
  for (size_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->mkeys[i], key) == 0) return f->mvals[i];
  return NULL;
}

int ferry_safetensors_shard_count(const ferry_safetensors *f) { return f ? f->nshards : 0; }

const char *ferry_safetensors_shard_path(const ferry_safetensors *f, int i) {
  if (!f || i < 0 || i >= f->nshards) return NULL;
  return f->shards[i].mem ? "" : f->shards[i].path;
}
