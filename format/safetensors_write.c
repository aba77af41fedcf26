/* format/safetensors_write.c — safetensors files, the writer: streaming,
 * with deterministic bytes (Hugging Face's layout: dtype then name order,
 * padded header), sharded above a size with model.safetensors.index.json.
 * The reader is safetensors.c.
 */
#include "format/safetensors.h"
#include "core/dtype.h"
#include "core/json.h" /* ferry_utf8_get */
#include "core/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the writer ------------------------------------------------------------- */

typedef struct {
  char *name;
  ferry_dtype dtype;
  int ndim;
  int64_t shape[FERRY_SAFETENSORS_MAX_DIMS];
  uint64_t nbytes;
  int shard;
  uint64_t begin;   /* within its shard's data section */
  uint64_t written;
} wt_entry;

typedef struct {
  char *path;
  ferry_outfile out; /* the file, written beside path and renamed over it at finish */
  int fd;            /* out.fd while it is open, else -1 */
  uint64_t data_start; /* 8 + header length */
  uint64_t bytes;      /* tensor bytes */
} wt_shard;

struct ferry_safetensors_writer {
  ferry_errbuf err;
  char *path;
  uint64_t max_shard;
  wt_entry *t;
  size_t nt, capt;
  char **mkeys, **mvals;
  size_t nmeta;
  int laid_out, finished, failed;
  size_t cur; /* next tensor to write */
  wt_shard *shards;
  int nshards;
  int made_dir;
};

/* A growable string for headers. */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->n + n + 1 > cap) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%llu", (unsigned long long)v);
  sb_str(b, t);
}

/* A JSON string. ascii = 0: serde_json's escaping (UTF-8 kept); ascii = 1:
 * Python json.dumps's default (ensure_ascii, \uXXXX with surrogates). The
 * input has been checked to be valid UTF-8. */
static void sb_json(sbuf *b, const char *s, int ascii) {
  sb_put(b, "\"", 1);
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n) {
    unsigned char c = *p;
    char t[16];
    if (c == '"') sb_str(b, "\\\"");
    else if (c == '\\') sb_str(b, "\\\\");
    else if (c == '\n') sb_str(b, "\\n");
    else if (c == '\r') sb_str(b, "\\r");
    else if (c == '\t') sb_str(b, "\\t");
    else if (c == '\b') sb_str(b, "\\b");
    else if (c == '\f') sb_str(b, "\\f");
    else if (c < 0x20) {
      snprintf(t, sizeof t, "\\u%04x", c);
      sb_str(b, t);
    } else if (c >= 0x80 && ascii) {
      unsigned cp = 0;
      size_t l = ferry_utf8_get(p, n, &cp);
      if (!l) l = 1, cp = 0xFFFD;
      if (cp >= 0x10000) {
        unsigned v = cp - 0x10000;
        snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        snprintf(t, sizeof t, "\\u%04x", cp);
      }
      sb_str(b, t);
      p += l;
      n -= l;
      continue;
    } else {
      sb_put(b, (const char *)p, 1);
    }
    p++;
    n--;
  }
  sb_put(b, "\"", 1);
}

static int valid_utf8(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n) {
    unsigned cp;
    size_t l = ferry_utf8_get(p, n, &cp);
    if (!l) return 0;
    p += l;
    n -= l;
  }
  return 1;
}

int ferry_safetensors_writer_create(const char *path, uint64_t max_shard_bytes,
                                    ferry_safetensors_writer **out) {
  if (!out) return ferry_err_thread(FERRY_EINVAL, "safetensors writer: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return ferry_err_thread(FERRY_EINVAL, "safetensors writer: no path");
  ferry_safetensors_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return ferry_err_thread(FERRY_ENOMEM, "safetensors writer: out of memory");
  }
  ferry_errbuf_init(&w->err);
  w->max_shard = max_shard_bytes;
  *out = w;
  return 0;
}

/* An unfinished writer's temporaries are removed: the files it was to
 * replace stay as they were. */
static void writer_cleanup_files(ferry_safetensors_writer *w) {
  for (int i = 0; i < w->nshards; i++) {
    ferry_outfile_abort(&w->shards[i].out);
    w->shards[i].fd = -1;
  }
  if (!w->finished && w->made_dir) rmdir(w->path);
}

void ferry_safetensors_writer_destroy(ferry_safetensors_writer *w) {
  if (!w) return;
  writer_cleanup_files(w);
  for (int i = 0; i < w->nshards; i++) free(w->shards[i].path);
  free(w->shards);
  for (size_t i = 0; i < w->nt; i++) free(w->t[i].name);
  free(w->t);
  for (size_t i = 0; i < w->nmeta; i++) {
    free(w->mkeys[i]);
    free(w->mvals[i]);
  }
  free(w->mkeys);
  free(w->mvals);
  free(w->path);
  ferry_errbuf_destroy(&w->err);
  free(w);
}

const char *ferry_safetensors_writer_last_error(const ferry_safetensors_writer *w) {
  return w ? ferry_err_msg(&w->err) : "";
}

int ferry_safetensors_writer_metadata(ferry_safetensors_writer *w, const char *key,
                                      const char *value) {
  if (!w || !key || !value) return FERRY_EINVAL;
  if (w->laid_out) return ferry_err(&w->err, FERRY_ESTATE, "metadata after the first write");
  if (!valid_utf8(key) || !valid_utf8(value))
    return ferry_err(&w->err, FERRY_EINVAL, "metadata '%.100s': not valid UTF-8", key);
  for (size_t i = 0; i < w->nmeta; i++)
    if (strcmp(w->mkeys[i], key) == 0) {
      char *v = strdup(value);
      if (!v) return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
      free(w->mvals[i]);
      w->mvals[i] = v;
      return 0;
    }
  char **nk = realloc(w->mkeys, (w->nmeta + 1) * sizeof *nk);
  if (nk) w->mkeys = nk;
  char **nv = realloc(w->mvals, (w->nmeta + 1) * sizeof *nv);
  if (nv) w->mvals = nv;
  char *k = strdup(key), *v = strdup(value);
  if (!nk || !nv || !k || !v) {
    free(k);
    free(v);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  w->mkeys[w->nmeta] = k;
  w->mvals[w->nmeta++] = v;
  return 0;
}

int ferry_safetensors_writer_add(ferry_safetensors_writer *w, const char *name,
                                 ferry_dtype dtype, int ndim, const int64_t *shape) {
  if (!w || !name) return FERRY_EINVAL;
  if (w->laid_out) return ferry_err(&w->err, FERRY_ESTATE, "tensor '%.200s' added after the "
                                    "first write", name);
  if (!name[0] || !valid_utf8(name) || strcmp(name, "__metadata__") == 0)
    return ferry_err(&w->err, FERRY_EINVAL, "tensor name '%.200s' not allowed", name);
  if (!ferry_dtype_traits_of(dtype))
    return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s': unknown dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > FERRY_SAFETENSORS_MAX_DIMS || (ndim && !shape))
    return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s': %d dimensions", name, ndim);
  uint64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s': negative dimension", name);
    uint64_t s = (uint64_t)shape[d];
    if (s && numel > UINT64_MAX / s)
      return ferry_err(&w->err, FERRY_EOVERFLOW, "tensor '%.200s': shape overflows", name);
    numel *= s;
  }
  if (numel > UINT64_MAX / 16)
    return ferry_err(&w->err, FERRY_EOVERFLOW, "tensor '%.200s': shape overflows", name);
  for (size_t i = 0; i < w->nt; i++)
    if (strcmp(w->t[i].name, name) == 0)
      return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s' added twice", name);
  if (w->nt == w->capt) {
    size_t cap = w->capt ? w->capt * 2 : 64;
    wt_entry *t = realloc(w->t, cap * sizeof *t);
    if (!t) return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
    w->t = t;
    w->capt = cap;
  }
  wt_entry *e = &w->t[w->nt];
  memset(e, 0, sizeof *e);
  if (!(e->name = strdup(name))) return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  e->dtype = dtype;
  e->ndim = ndim;
  if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
  e->nbytes = numel * ferry_dtype_size(dtype);
  w->nt++;
  return 0;
}

/* Hugging Face's order: dtypes later in safetensors' own list first (its
 * rank), then name. */
static int cmp_layout(const void *a, const void *b) {
  const wt_entry *x = a, *y = b;
  int rx = ferry_dtype_traits_of(x->dtype)->rank, ry = ferry_dtype_traits_of(y->dtype)->rank;
  if (rx != ry) return rx > ry ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int write_full(int fd, const void *buf, size_t n, uint64_t off) {
  const unsigned char *p = buf;
  while (n) {
    ssize_t r = pwrite(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

static int io_status(int neg_errno) { return ferry_outfile_status(-neg_errno); }

/* The reason of a failed write (-errno), the file size limit named. */
#define IO_REASON(r) ferry_outfile_reason(-(r), (char[200]){0}, 200)

/* Tensors in Hugging Face's order; metadata sorted by key so the header does
 * not depend on call order. */
static void layout_order(ferry_safetensors_writer *w) {
  if (w->nt) qsort(w->t, w->nt, sizeof *w->t, cmp_layout);
  for (size_t i = 1; i < w->nmeta; i++)
    for (size_t k = i; k > 0 && strcmp(w->mkeys[k - 1], w->mkeys[k]) > 0; k--) {
      char *t = w->mkeys[k];
      w->mkeys[k] = w->mkeys[k - 1];
      w->mkeys[k - 1] = t;
      t = w->mvals[k];
      w->mvals[k] = w->mvals[k - 1];
      w->mvals[k - 1] = t;
    }
}

/* Shards filled greedily in data order: each tensor's shard and offset;
 * the number of shards. */
static int assign_shards(ferry_safetensors_writer *w) {
  int ns = 1;
  uint64_t cur = 0;
  for (size_t i = 0; i < w->nt; i++) {
    if (w->max_shard && cur > 0 && cur + w->t[i].nbytes > w->max_shard) {
      ns++;
      cur = 0;
    }
    w->t[i].shard = ns - 1;
    w->t[i].begin = cur;
    cur += w->t[i].nbytes;
  }
  return ns;
}

int st_writer_file_count(ferry_safetensors_writer *w, uint64_t *files) {
  if (!w || !files) return FERRY_EINVAL;
  if (!w->laid_out) layout_order(w);
  int ns = w->laid_out ? w->nshards : assign_shards(w);
  *files = (uint64_t)ns + (w->max_shard && ns > 1);
  return 0;
}

/* Shards filled greedily in data order, their paths named (a folder of
 * model-0000i-of-0000n.safetensors when sharding), the folder made. */
static int layout_shards(ferry_safetensors_writer *w) {
  int ns = assign_shards(w);
  w->shards = calloc((size_t)ns, sizeof *w->shards);
  if (!w->shards) return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  w->nshards = ns;
  for (int s = 0; s < ns; s++) w->shards[s].fd = -1;
  if (w->max_shard) {
    if (mkdir(w->path, 0777) == 0) w->made_dir = 1;
    else if (errno != EEXIST)
      return ferry_err(&w->err, io_status(-errno), "%s: mkdir: %s", w->path, strerror(errno));
  }
  for (int s = 0; s < ns; s++) {
    char name[64];
    if (!w->max_shard) {
      w->shards[s].path = strdup(w->path);
    } else {
      if (ns == 1) snprintf(name, sizeof name, "model.safetensors");
      else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, ns);
      w->shards[s].path = st_path_join(w->path, name);
    }
    if (!w->shards[s].path) return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  return 0;
}

/* Shard s's header: the metadata, then its tensors, padded with spaces to a
 * multiple of 8 bytes. Adds its tensors' bytes to the shard. */
static void shard_header(ferry_safetensors_writer *w, int s, sbuf *b) {
  sb_put(b, "{", 1);
  int first = 1;
  if (w->nmeta) {
    sb_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
      if (i) sb_put(b, ",", 1);
      sb_json(b, w->mkeys[i], 0);
      sb_put(b, ":", 1);
      sb_json(b, w->mvals[i], 0);
    }
    sb_put(b, "}", 1);
    first = 0;
  }
  for (size_t i = 0; i < w->nt; i++) {
    const wt_entry *e = &w->t[i];
    if (e->shard != s) continue;
    if (!first) sb_put(b, ",", 1);
    first = 0;
    sb_json(b, e->name, 0);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, ferry_dtype_name(e->dtype));
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < e->ndim; d++) {
      if (d) sb_put(b, ",", 1);
      sb_u64(b, (uint64_t)e->shape[d]);
    }
    sb_str(b, "],\"data_offsets\":[");
    sb_u64(b, e->begin);
    sb_put(b, ",", 1);
    sb_u64(b, e->begin + e->nbytes);
    sb_str(b, "]}");
    w->shards[s].bytes += e->nbytes;
  }
  sb_put(b, "}", 1);
  while (!b->oom && b->n % 8) sb_put(b, " ", 1);
}

/* Creates shard s's file and writes its header length and header. */
static int write_shard_header(ferry_safetensors_writer *w, int s) {
  sbuf b = {0};
  shard_header(w, s, &b);
  if (b.oom) {
    free(b.s);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
  wt_shard *sh = &w->shards[s];
  sh->data_start = 8 + b.n;
  char why[512];
  int rc = ferry_outfile_open(&sh->out, sh->path, why, sizeof why);
  if (rc) {
    free(b.s);
    return ferry_err(&w->err, rc, "%s", why);
  }
  sh->fd = sh->out.fd;
  int r = write_full(sh->fd, len8, 8, 0);
  if (!r) r = write_full(sh->fd, b.s, b.n, 8);
  free(b.s);
  if (r)
    return ferry_err(&w->err, io_status(r), "%s: writing the header: %s", sh->path,
                     IO_REASON(r));
  return 0;
}

/* At the first write: the order, the shards and every shard's header. */
static int layout(ferry_safetensors_writer *w) {
  if (w->failed) return FERRY_ESTATE; /* the message stays the first failure's */
  if (w->laid_out) return 0;
  w->laid_out = 1;
  layout_order(w);
  int rc = layout_shards(w);
  for (int s = 0; !rc && s < w->nshards; s++) rc = write_shard_header(w, s);
  if (rc) {
    w->failed = 1;
    return rc;
  }
  w->cur = 0;
  while (w->cur < w->nt && w->t[w->cur].nbytes == 0) w->cur++;
  return 0;
}

const char *ferry_safetensors_writer_next(ferry_safetensors_writer *w) {
  if (!w || layout(w)) return NULL;
  return w->cur < w->nt ? w->t[w->cur].name : NULL;
}

int ferry_safetensors_writer_write(ferry_safetensors_writer *w, const char *name,
                                   const void *data, size_t bytes) {
  if (!w || !name || (!data && bytes)) return FERRY_EINVAL;
  int rc = layout(w);
  if (rc) return rc;
  if (w->finished) return ferry_err(&w->err, FERRY_ESTATE, "write after finish");
  if (w->cur >= w->nt || strcmp(w->t[w->cur].name, name) != 0)
    return ferry_err(&w->err, FERRY_ESTATE, "tensor '%.200s' written out of order: expected "
                     "'%.200s'", name, w->cur < w->nt ? w->t[w->cur].name : "(none: all written)");
  wt_entry *e = &w->t[w->cur];
  if (bytes > e->nbytes - e->written)
    return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s': %zu bytes given, %llu left", name,
                     bytes, (unsigned long long)(e->nbytes - e->written));
  wt_shard *sh = &w->shards[e->shard];
  int r = write_full(sh->fd, data, bytes, sh->data_start + e->begin + e->written);
  if (r) {
    w->failed = 1;
    return ferry_err(&w->err, io_status(r), "%s: tensor '%.200s': write: %s", sh->path, name,
                     IO_REASON(r));
  }
  e->written += bytes;
  while (w->cur < w->nt && w->t[w->cur].written == w->t[w->cur].nbytes) w->cur++;
  return 0;
}

static int write_index(ferry_safetensors_writer *w) {
  sbuf b = {0};
  uint64_t total = 0;
  for (size_t i = 0; i < w->nt; i++) total += w->t[i].nbytes;
  sb_str(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
  sb_u64(&b, total);
  sb_str(&b, "\n  },\n  \"weight_map\": {");
  size_t *ord = malloc((w->nt ? w->nt : 1) * sizeof *ord);
  if (!ord) {
    free(b.s);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < w->nt; i++) ord[i] = i;
  for (size_t i = 1; i < w->nt; i++)
    for (size_t k = i; k > 0 && strcmp(w->t[ord[k - 1]].name, w->t[ord[k]].name) > 0; k--) {
      size_t t = ord[k];
      ord[k] = ord[k - 1];
      ord[k - 1] = t;
    }
  for (size_t i = 0; i < w->nt; i++) {
    const wt_entry *e = &w->t[ord[i]];
    sb_str(&b, i ? ",\n    " : "\n    ");
    sb_json(&b, e->name, 1);
    sb_str(&b, ": ");
    const char *p = strrchr(w->shards[e->shard].path, '/');
    sb_json(&b, p ? p + 1 : w->shards[e->shard].path, 1);
  }
  free(ord);
  sb_str(&b, w->nt ? "\n  }\n}\n" : "}\n}\n");
  if (b.oom) {
    free(b.s);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  char *path = st_path_join(w->path, "model.safetensors.index.json");
  if (!path) {
    free(b.s);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  ferry_outfile o;
  char why[512];
  int rc = ferry_outfile_open(&o, path, why, sizeof why);
  if (!rc) {
    int r = write_full(o.fd, b.s, b.n, 0);
    if (r) {
      rc = io_status(r);
      snprintf(why, sizeof why, "%s: write: %s", path, IO_REASON(r));
      ferry_outfile_abort(&o);
    } else {
      rc = ferry_outfile_commit(&o, why, sizeof why);
    }
  }
  free(b.s);
  free(path);
  return rc ? ferry_err(&w->err, rc, "%s", why) : 0;
}

int st_writer_finish_holes(ferry_safetensors_writer *w) {
  if (!w) return FERRY_EINVAL;
  int rc = layout(w);
  if (rc) return rc;
  for (size_t i = 0; i < w->nt; i++)
    if (w->t[i].written)
      return ferry_err(&w->err, FERRY_ESTATE, "tensor '%.200s' was written: no holes", w->t[i].name);
  for (int s = 0; s < w->nshards; s++) {
    wt_shard *sh = &w->shards[s];
    if (ftruncate(sh->fd, (off_t)(sh->data_start + sh->bytes))) {
      int r = -errno;
      w->failed = 1;
      return ferry_err(&w->err, io_status(r), "%s: sizing: %s", sh->path, IO_REASON(r));
    }
  }
  for (size_t i = 0; i < w->nt; i++) w->t[i].written = w->t[i].nbytes;
  w->cur = w->nt;
  return ferry_safetensors_writer_finish(w);
}

int ferry_safetensors_writer_finish(ferry_safetensors_writer *w) {
  if (!w) return FERRY_EINVAL;
  int rc = layout(w);
  if (rc) return rc;
  if (w->finished) return ferry_err(&w->err, FERRY_ESTATE, "finished twice");
  if (w->cur < w->nt)
    return ferry_err(&w->err, FERRY_ESTATE, "tensor '%.200s': %llu of %llu bytes written",
                     w->t[w->cur].name, (unsigned long long)w->t[w->cur].written,
                     (unsigned long long)w->t[w->cur].nbytes);
  /* every shard on disk before any replaces its target */
  for (int s = 0; s < w->nshards; s++) {
    wt_shard *sh = &w->shards[s];
    if (fsync(sh->fd) != 0) {
      int r = -errno;
      w->failed = 1;
      return ferry_err(&w->err, io_status(r), "%s: fsync: %s", sh->path, IO_REASON(r));
    }
  }
  for (int s = 0; s < w->nshards; s++) {
    char why[512];
    w->shards[s].fd = -1;
    rc = ferry_outfile_commit(&w->shards[s].out, why, sizeof why);
    if (rc) {
      w->failed = 1;
      return ferry_err(&w->err, rc, "%s", why);
    }
  }
  if (w->max_shard && w->nshards > 1) {
    rc = write_index(w);
    if (rc) {
      w->failed = 1;
      return rc;
    }
  }
  w->finished = 1;
  return 0;
}
