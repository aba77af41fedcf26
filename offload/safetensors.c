/* offload/safetensors.c — safetensors files: a strict reader (a small JSON
 * parser that knows only the header's shape, every offset, size and name
 * checked before any tensor byte is read), sharded models through
 * model.safetensors.index.json, and a streaming writer whose bytes are
 * deterministic (Hugging Face's layout: dtype then name order, padded header).
 */
#include "offload/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- dtypes ---------------------------------------------------------------- */

static const struct {
  const char *name;
  size_t size;
} k_dtypes[FERRY_ST_DTYPE_COUNT] = {
    [FERRY_ST_BOOL] = {"BOOL", 1},       [FERRY_ST_U8] = {"U8", 1},
    [FERRY_ST_I8] = {"I8", 1},           [FERRY_ST_F8_E5M2] = {"F8_E5M2", 1},
    [FERRY_ST_F8_E4M3] = {"F8_E4M3", 1}, [FERRY_ST_I16] = {"I16", 2},
    [FERRY_ST_U16] = {"U16", 2},         [FERRY_ST_F16] = {"F16", 2},
    [FERRY_ST_BF16] = {"BF16", 2},       [FERRY_ST_I32] = {"I32", 4},
    [FERRY_ST_U32] = {"U32", 4},         [FERRY_ST_F32] = {"F32", 4},
    [FERRY_ST_F64] = {"F64", 8},         [FERRY_ST_I64] = {"I64", 8},
    [FERRY_ST_U64] = {"U64", 8},
};

const char *ferry_st_dtype_name(ferry_st_dtype d) {
  return (unsigned)d < FERRY_ST_DTYPE_COUNT ? k_dtypes[d].name : NULL;
}

size_t ferry_st_dtype_size(ferry_st_dtype d) {
  return (unsigned)d < FERRY_ST_DTYPE_COUNT ? k_dtypes[d].size : 0;
}

int ferry_st_dtype_parse(const char *s, size_t len) {
  for (int i = 0; i < FERRY_ST_DTYPE_COUNT; i++)
    if (strlen(k_dtypes[i].name) == len && memcmp(k_dtypes[i].name, s, len) == 0) return i;
  return -1;
}

/* ---- the JSON subset --------------------------------------------------------
 * A cursor over the header bytes. Every function either advances past what it
 * parsed or sets `why` and returns -1; nothing reads past `end`. */

typedef struct {
  const char *p, *end, *begin;
  char why[256];
} jcur;

static void jset(jcur *j, const char *fmt, ...) FERRY_PRINTF(2, 3);
static void jset(jcur *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->why, sizeof j->why, fmt, ap);
  va_end(ap);
}

static int jfail(jcur *j, const char *what) {
  if (!j->why[0])
    jset(j, "bad JSON at byte %zu: %s", (size_t)(j->p - j->begin), what);
  return -1;
}

static void jws(jcur *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static int jpeek(jcur *j) {
  jws(j);
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

static int jexpect(jcur *j, char c) {
  if (jpeek(j) != (unsigned char)c) {
    char m[32];
    snprintf(m, sizeof m, "expected '%c'", c);
    return jfail(j, m);
  }
  j->p++;
  return 0;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int read_hex4(jcur *j, unsigned *out) {
  if (j->end - j->p < 4) return jfail(j, "short \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval((unsigned char)j->p[i]);
    if (h < 0) return jfail(j, "bad \\u escape");
    v = v * 16 + (unsigned)h;
  }
  j->p += 4;
  *out = v;
  return 0;
}

static size_t utf8_put(char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Decodes one UTF-8 sequence at s (n bytes left); 0 when invalid. */
static size_t utf8_get(const unsigned char *s, size_t n, unsigned *cp) {
  if (n == 0) return 0;
  unsigned c = s[0];
  size_t len;
  unsigned min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, min = 0x80, c &= 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, min = 0x800, c &= 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, c &= 0x07;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    c = (c << 6) | (s[i] & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return len;
}

/* A string: decoded into a fresh NUL-terminated buffer (*out, *len). Strings
 * holding a NUL (\u0000) are refused: names are C strings here. */
static int jstring(jcur *j, char **out, size_t *outlen) {
  if (jexpect(j, '"')) return -1;
  const char *s = j->p;
  while (j->p < j->end && *j->p != '"') {
    if (*j->p == '\\') j->p++;
    if (j->p < j->end) j->p++;
  }
  if (j->p >= j->end) return jfail(j, "unterminated string");
  size_t raw = (size_t)(j->p - s);
  const char *stop = j->p;
  j->p = s;
  char *o = malloc(raw + 1);
  if (!o) return jfail(j, "out of memory");
  size_t n = 0;
  while (j->p < stop) {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) {
      free(o);
      return jfail(j, "control character in string");
    }
    if (c != '\\') {
      unsigned cp;
      size_t l = utf8_get((const unsigned char *)j->p, (size_t)(stop - j->p), &cp);
      if (!l) {
        free(o);
        return jfail(j, "invalid UTF-8 in string");
      }
      memcpy(o + n, j->p, l);
      n += l;
      j->p += l;
      continue;
    }
    j->p++;
    char e = *j->p++;
    switch (e) {
    case '"': o[n++] = '"'; break;
    case '\\': o[n++] = '\\'; break;
    case '/': o[n++] = '/'; break;
    case 'b': o[n++] = '\b'; break;
    case 'f': o[n++] = '\f'; break;
    case 'n': o[n++] = '\n'; break;
    case 'r': o[n++] = '\r'; break;
    case 't': o[n++] = '\t'; break;
    case 'u': {
      unsigned cp, lo;
      if (read_hex4(j, &cp)) {
        free(o);
        return -1;
      }
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (stop - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') {
          free(o);
          return jfail(j, "lone surrogate in \\u escape");
        }
        j->p += 2;
        if (read_hex4(j, &lo)) {
          free(o);
          return -1;
        }
        if (lo < 0xDC00 || lo > 0xDFFF) {
          free(o);
          return jfail(j, "bad surrogate pair");
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        free(o);
        return jfail(j, "lone surrogate in \\u escape");
      }
      if (cp == 0) {
        free(o);
        return jfail(j, "NUL in string");
      }
      /* an escape is at least 6 bytes and encodes to at most 4 */
      n += utf8_put(o + n, cp);
      break;
    }
    default: free(o); return jfail(j, "bad escape");
    }
  }
  j->p = stop + 1;
  o[n] = '\0';
  *out = o;
  if (outlen) *outlen = n;
  return 0;
}

/* A non-negative integer that fits in 64 bits (no sign, fraction, exponent,
 * leading zeros). */
static int juint(jcur *j, uint64_t *out) {
  jws(j);
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') return jfail(j, "expected an unsigned integer");
  if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9')
    return jfail(j, "leading zero");
  uint64_t v = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    unsigned d = (unsigned)(*j->p - '0');
    if (v > (UINT64_MAX - d) / 10) return jfail(j, "integer does not fit in 64 bits");
    v = v * 10 + d;
    j->p++;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
    return jfail(j, "expected an integer");
  *out = v;
  return 0;
}

static int jliteral(jcur *j, const char *lit) {
  size_t n = strlen(lit);
  jws(j);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return jfail(j, "bad literal");
  j->p += n;
  return 0;
}

/* Skips any JSON value (used for the index's "metadata"), nesting bounded. */
static int jskip(jcur *j, int depth) {
  if (depth > 64) return jfail(j, "nesting too deep");
  int c = jpeek(j);
  if (c == '"') {
    char *s;
    if (jstring(j, &s, NULL)) return -1;
    free(s);
    return 0;
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    if (jpeek(j) == close) {
      j->p++;
      return 0;
    }
    for (;;) {
      if (c == '{') {
        char *k;
        if (jstring(j, &k, NULL)) return -1;
        free(k);
        if (jexpect(j, ':')) return -1;
      }
      if (jskip(j, depth + 1)) return -1;
      int d = jpeek(j);
      if (d == ',') {
        j->p++;
        continue;
      }
      if (d == close) {
        j->p++;
        return 0;
      }
      return jfail(j, "expected ',' or a closing bracket");
    }
  }
  if (c == 't') return jliteral(j, "true");
  if (c == 'f') return jliteral(j, "false");
  if (c == 'n') return jliteral(j, "null");
  if (c == '-' || (c >= '0' && c <= '9')) {
    if (c == '-') j->p++;
    int digits = 0;
    while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' ||
                             *j->p == 'E' || *j->p == '+' || *j->p == '-')) {
      j->p++;
      digits++;
    }
    return digits ? 0 : jfail(j, "bad number");
  }
  return jfail(j, "expected a value");
}

/* ---- the reader -------------------------------------------------------------- */

typedef struct {
  char *name;
  ferry_st_dtype dtype;
  int ndim;
  int64_t shape[FERRY_ST_MAX_DIMS];
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

/* One tensor's object: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static int parse_tensor(jcur *j, st_entry *e, const char *name) {
  int have_dtype = 0, have_shape = 0, have_off = 0;
  if (jexpect(j, '{')) return -1;
  if (jpeek(j) == '}') return jfail(j, "empty tensor entry");
  for (;;) {
    char *k;
    if (jstring(j, &k, NULL)) return -1;
    if (jexpect(j, ':')) {
      free(k);
      return -1;
    }
    if (strcmp(k, "dtype") == 0) {
      free(k);
      if (have_dtype++) return jfail(j, "\"dtype\" given twice");
      char *d;
      size_t dl;
      if (jstring(j, &d, &dl)) return -1;
      int dt = ferry_st_dtype_parse(d, dl);
      if (dt < 0) {
        jset(j, "tensor '%.128s': unknown dtype '%.32s'", name, d);
        free(d);
        return -1;
      }
      free(d);
      e->dtype = (ferry_st_dtype)dt;
    } else if (strcmp(k, "shape") == 0) {
      free(k);
      if (have_shape++) return jfail(j, "\"shape\" given twice");
      if (jexpect(j, '[')) return -1;
      e->ndim = 0;
      if (jpeek(j) == ']') {
        j->p++;
      } else {
        for (;;) {
          uint64_t v;
          if (juint(j, &v)) return -1;
          if (e->ndim == FERRY_ST_MAX_DIMS) {
            jset(j, "tensor '%.128s': more than %d dimensions", name,
                     FERRY_ST_MAX_DIMS);
            return -1;
          }
          if (v > (uint64_t)INT64_MAX) {
            jset(j, "tensor '%.128s': dimension %llu too large", name,
                     (unsigned long long)v);
            return -1;
          }
          e->shape[e->ndim++] = (int64_t)v;
          int c = jpeek(j);
          if (c == ',') {
            j->p++;
            continue;
          }
          if (jexpect(j, ']')) return -1;
          break;
        }
      }
    } else if (strcmp(k, "data_offsets") == 0) {
      free(k);
      if (have_off++) return jfail(j, "\"data_offsets\" given twice");
      if (jexpect(j, '[') || juint(j, &e->begin) || jexpect(j, ',') || juint(j, &e->end) ||
          jexpect(j, ']'))
        return -1;
    } else {
      jset(j, "tensor '%.128s': unknown field '%.64s'", name, k);
      free(k);
      return -1;
    }
    int c = jpeek(j);
    if (c == ',') {
      j->p++;
      continue;
    }
    if (jexpect(j, '}')) return -1;
    break;
  }
  if (!have_dtype || !have_shape || !have_off) {
    jset(j, "tensor '%.128s': missing \"%s\"", name,
             !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return -1;
  }
  return 0;
}

static int parse_metadata(jcur *j, ferry_safetensors *f, int keep) {
  if (jpeek(j) == 'n') return jliteral(j, "null");
  if (jexpect(j, '{')) return -1;
  if (jpeek(j) == '}') {
    j->p++;
    return 0;
  }
  for (;;) {
    char *k, *v;
    if (jstring(j, &k, NULL)) return -1;
    if (jexpect(j, ':') || jstring(j, &v, NULL)) {
      free(k);
      return -1;
    }
    if (keep) {
      for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->mkeys[i], k) == 0) {
          jset(j, "__metadata__: key '%.128s' given twice", k);
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
        return jfail(j, "out of memory");
      }
      f->mkeys[f->nmeta] = k;
      f->mvals[f->nmeta++] = v;
    } else {
      free(k);
      free(v);
    }
    int c = jpeek(j);
    if (c == ',') {
      j->p++;
      continue;
    }
    return jexpect(j, '}');
  }
}

static int cmp_begin(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses one file's header (hdr, n bytes) and checks every tensor against
 * the data section of `data_len` bytes; appends its tensors to f. */
static int parse_header(ferry_safetensors *f, int shard, const char *hdr, uint64_t n,
                        uint64_t data_len) {
  jcur j = {.p = hdr, .end = hdr + n, .begin = hdr, .why = ""};
  size_t first = f->nt;
  int have_meta = 0;
  if (jpeek(&j) != '{') {
    jfail(&j, "header does not start with '{'");
    goto bad;
  }
  j.p++;
  if (jpeek(&j) == '}') {
    j.p++;
  } else {
    for (;;) {
      char *name;
      if (jstring(&j, &name, NULL)) goto bad;
      if (jexpect(&j, ':')) {
        free(name);
        goto bad;
      }
      if (strcmp(name, "__metadata__") == 0) {
        free(name);
        if (have_meta++) {
          jfail(&j, "__metadata__ given twice");
          goto bad;
        }
        if (parse_metadata(&j, f, shard == 0)) goto bad;
      } else {
        st_entry e = {.name = name, .shard = shard};
        if (parse_tensor(&j, &e, name) || st_push(f, &e)) {
          if (!j.why[0]) jfail(&j, "out of memory");
          free(name);
          goto bad;
        }
      }
      int c = jpeek(&j);
      if (c == ',') {
        j.p++;
        continue;
      }
      if (jexpect(&j, '}')) goto bad;
      break;
    }
  }
  jws(&j);
  if (j.p != j.end) {
    jfail(&j, "trailing bytes after the header object");
    goto bad;
  }
  /* sizes: shape product times the element size, without overflow */
  for (size_t i = first; i < f->nt; i++) {
    st_entry *e = &f->t[i];
    uint64_t numel = 1;
    int over = 0;
    for (int d = 0; d < e->ndim; d++) {
      uint64_t s = (uint64_t)e->shape[d];
      if (s && numel > UINT64_MAX / s) over = 1;
      numel *= s;
    }
    size_t es = ferry_st_dtype_size(e->dtype);
    if (!over && numel > UINT64_MAX / es) over = 1;
    if (over) {
      jset(&j, "tensor '%.128s': shape overflows 64 bits", e->name);
      goto bad;
    }
    e->numel = numel;
    e->nbytes = numel * es;
    if (e->end < e->begin) {
      jset(&j, "tensor '%.128s': data_offsets [%llu, %llu] end before begin",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
      goto bad;
    }
    if (e->end - e->begin != e->nbytes) {
      jset(&j,
               "tensor '%.128s': data_offsets [%llu, %llu] hold %llu bytes but shape x %s needs "
               "%llu",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
               (unsigned long long)(e->end - e->begin), ferry_st_dtype_name(e->dtype),
               (unsigned long long)e->nbytes);
      goto bad;
    }
    if (e->end > data_len) {
      jset(&j,
               "tensor '%.128s': data_offsets [%llu, %llu] past the end of the data (%llu bytes: "
               "truncated file?)",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
               (unsigned long long)data_len);
      goto bad;
    }
    e->offset = 8 + n + e->begin;
  }
  /* file order; ranges must tile the data section: no overlap, no hole */
  if (f->nt > first) qsort(f->t + first, f->nt - first, sizeof *f->t, cmp_begin);
  uint64_t at = 0;
  for (size_t i = first; i < f->nt; i++) {
    st_entry *e = &f->t[i];
    if (e->begin < at) {
      jset(&j, "tensor '%.128s': data_offsets [%llu, %llu] overlap '%.128s'",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
               f->t[i - 1].name);
      goto bad;
    }
    if (e->begin > at) {
      jset(&j, "tensor '%.128s': hole of %llu bytes before its data",
               e->name, (unsigned long long)(e->begin - at));
      goto bad;
    }
    at = e->end;
  }
  if (at != data_len) {
    jset(&j, "%llu bytes after the last tensor's data",
             (unsigned long long)(data_len - at));
    goto bad;
  }
  return 0;
bad:
  return ferry_err(&f->err, FERRY_ECORRUPT, "%s: %s", f->shards[shard].path, j.why);
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

/* Opens and parses one file into shard slot s (path already set). */
static int open_shard(ferry_safetensors *f, int s) {
  st_shard *sh = &f->shards[s];
  unsigned char len8[8];
  if (!sh->mem) {
    sh->fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0)
      return ferry_err(&f->err, errno == ENOENT ? FERRY_ENOENT : errno == EACCES ? FERRY_EPERM
                                                                                 : FERRY_EIO,
                       "%s: open: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(sh->fd, &st) != 0)
      return ferry_err(&f->err, FERRY_EIO, "%s: fstat: %s", sh->path, strerror(errno));
    if (!S_ISREG(st.st_mode))
      return ferry_err(&f->err, FERRY_EINVAL, "%s: not a regular file", sh->path);
    sh->size = (uint64_t)st.st_size;
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

static int st_fail(ferry_safetensors *f, int rc, ferry_safetensors **out) {
  ferry_err_thread(rc, "safetensors: %s", ferry_err_msg(&f->err));
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
  int rc = open_shard(f, 0);
  if (!rc) rc = build_index(f);
  if (rc) return st_fail(f, rc, out);
  *out = f;
  return 0;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static char *read_small_file(const char *path, size_t max, size_t *len, int *rc, char *why,
                             size_t wl) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    *rc = errno == ENOENT ? FERRY_ENOENT : FERRY_EIO;
    snprintf(why, wl, "%s: open: %s", path, strerror(errno));
    return NULL;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      if (cap >= max) {
        *rc = FERRY_ECORRUPT;
        snprintf(why, wl, "%s: larger than %zu bytes", path, max);
        free(buf);
        fclose(fp);
        return NULL;
      }
      cap = cap ? cap * 2 : 65536;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        *rc = FERRY_ENOMEM;
        snprintf(why, wl, "%s: out of memory", path);
        free(buf);
        fclose(fp);
        return NULL;
      }
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n, fp);
    n += r;
    if (r == 0) break;
  }
  int err = ferror(fp);
  fclose(fp);
  if (err) {
    *rc = FERRY_EIO;
    snprintf(why, wl, "%s: read failed", path);
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

typedef struct {
  char *name, *file;
} wm_entry;

static int cmp_wm(const void *a, const void *b) {
  return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {name: file}}. */
static int open_index(const char *path, ferry_safetensors **out) {
  char why[512] = "";
  int rc = 0;
  size_t len = 0;
  char *text = read_small_file(path, 256u << 20, &len, &rc, why, sizeof why);
  if (!text) return ferry_err_thread(rc, "safetensors: %s", why);
  jcur j = {.p = text, .end = text + len, .begin = text, .why = ""};
  wm_entry *wm = NULL;
  size_t nwm = 0, capwm = 0;
  char **files = NULL;
  size_t nfiles = 0;
  ferry_safetensors *f = NULL;
  int have_wm = 0;
  rc = FERRY_ECORRUPT;
  if (jexpect(&j, '{')) goto bad;
  if (jpeek(&j) != '}') {
    for (;;) {
      char *k;
      if (jstring(&j, &k, NULL)) goto bad;
      if (jexpect(&j, ':')) {
        free(k);
        goto bad;
      }
      int is_wm = strcmp(k, "weight_map") == 0;
      free(k);
      if (!is_wm) {
        if (jskip(&j, 0)) goto bad;
      } else {
        if (have_wm++) {
          jfail(&j, "weight_map given twice");
          goto bad;
        }
        if (jexpect(&j, '{')) goto bad;
        if (jpeek(&j) == '}') {
          j.p++;
        } else {
          for (;;) {
            wm_entry e = {0};
            if (jstring(&j, &e.name, NULL)) goto bad;
            if (jexpect(&j, ':') || jstring(&j, &e.file, NULL)) {
              free(e.name);
              goto bad;
            }
            if (nwm == capwm) {
              capwm = capwm ? capwm * 2 : 256;
              wm_entry *n2 = realloc(wm, capwm * sizeof *wm);
              if (!n2) {
                free(e.name);
                free(e.file);
                rc = FERRY_ENOMEM;
                jfail(&j, "out of memory");
                goto bad;
              }
              wm = n2;
            }
            wm[nwm++] = e;
            int c = jpeek(&j);
            if (c == ',') {
              j.p++;
              continue;
            }
            if (jexpect(&j, '}')) goto bad;
            break;
          }
        }
      }
      int c = jpeek(&j);
      if (c == ',') {
        j.p++;
        continue;
      }
      if (jexpect(&j, '}')) goto bad;
      break;
    }
  } else {
    j.p++;
  }
  jws(&j);
  if (j.p != j.end) {
    jfail(&j, "trailing bytes");
    goto bad;
  }
  if (!have_wm) {
    jset(&j, "no \"weight_map\"");
    goto bad;
  }
  if (nwm) qsort(wm, nwm, sizeof *wm, cmp_wm);
  for (size_t i = 0; i < nwm; i++) {
    if (i && strcmp(wm[i].name, wm[i - 1].name) == 0) {
      jset(&j, "weight_map: tensor '%.200s' given twice", wm[i].name);
      goto bad;
    }
    if (!wm[i].file[0] || strchr(wm[i].file, '/') || strcmp(wm[i].file, "..") == 0 ||
        strcmp(wm[i].file, ".") == 0) {
      jset(&j, "weight_map: tensor '%.200s': file '%.100s' is not a plain "
               "file name in the index's folder", wm[i].name, wm[i].file);
      goto bad;
    }
  }
  /* the distinct shard files, sorted */
  files = malloc((nwm ? nwm : 1) * sizeof *files);
  if (!files) {
    rc = FERRY_ENOMEM;
    goto bad;
  }
  for (size_t i = 0; i < nwm; i++) files[i] = wm[i].file;
  if (nwm) qsort(files, nwm, sizeof *files, cmp_str);
  for (size_t i = 0; i < nwm; i++)
    if (!nfiles || strcmp(files[nfiles - 1], files[i]) != 0) files[nfiles++] = files[i];
  if (nfiles > 100000) {
    jset(&j, "weight_map names %zu files", nfiles);
    goto bad;
  }
  f = st_new(nfiles ? (int)nfiles : 1);
  if (!f) {
    rc = FERRY_ENOMEM;
    goto bad;
  }
  if (!nfiles) f->nshards = 0;
  {
    char *dir = strdup(path);
    if (!dir) {
      rc = FERRY_ENOMEM;
      goto bad;
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else strcpy(dir, ".");
    for (size_t i = 0; i < nfiles; i++) {
      f->shards[i].path = path_join(dir, files[i]);
      if (!f->shards[i].path) {
        free(dir);
        rc = FERRY_ENOMEM;
        goto bad;
      }
    }
    free(dir);
  }
  for (size_t i = 0; i < nfiles; i++) {
    rc = open_shard(f, (int)i);
    if (rc) goto bad_f;
  }
  rc = build_index(f);
  if (rc) goto bad_f;
  /* the weight_map and the shards must agree exactly */
  for (size_t i = 0; i < nwm; i++) {
    size_t lo = 0, hi = f->nt;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      int c = strcmp(f->t[f->by_name[mid]].name, wm[i].name);
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo == f->nt || strcmp(f->t[f->by_name[lo]].name, wm[i].name) != 0) {
      rc = ferry_err(&f->err, FERRY_ECORRUPT, "%s: tensor '%.200s' is in the weight_map but not "
                     "in %s", path, wm[i].name, wm[i].file);
      goto bad_f;
    }
    const st_entry *e = &f->t[f->by_name[lo]];
    if (!ends_with(f->shards[e->shard].path, wm[i].file) ||
        f->shards[e->shard].path[strlen(f->shards[e->shard].path) - strlen(wm[i].file) - 1] !=
            '/') {
      rc = ferry_err(&f->err, FERRY_ECORRUPT, "%s: tensor '%.200s' is mapped to %s but found in "
                     "%s", path, wm[i].name, wm[i].file, f->shards[e->shard].path);
      goto bad_f;
    }
  }
  if (f->nt != nwm) {
    rc = ferry_err(&f->err, FERRY_ECORRUPT, "%s: the shards hold %zu tensors but the weight_map "
                   "names %zu", path, f->nt, nwm);
    goto bad_f;
  }
  for (size_t i = 0; i < nwm; i++) {
    free(wm[i].name);
    free(wm[i].file);
  }
  free(wm);
  free(files);
  free(text);
  *out = f;
  return 0;
bad_f:
  for (size_t i = 0; i < nwm; i++) {
    free(wm[i].name);
    free(wm[i].file);
  }
  free(wm);
  free(files);
  free(text);
  return st_fail(f, rc, out);
bad:
  for (size_t i = 0; i < nwm; i++) {
    free(wm[i].name);
    free(wm[i].file);
  }
  free(wm);
  free(files);
  free(text);
  st_free(f);
  *out = NULL;
  return ferry_err_thread(rc, "safetensors: %s: %s", path, j.why[0] ? j.why : "out of memory");
}

int ferry_safetensors_open(const char *path, ferry_safetensors **out) {
  if (!out) return ferry_err_thread(FERRY_EINVAL, "safetensors: out is NULL");
  *out = NULL;
  if (!path || !path[0]) return ferry_err_thread(FERRY_EINVAL, "safetensors: no path");
  struct stat st;
  if (stat(path, &st) != 0)
    return ferry_err_thread(errno == ENOENT ? FERRY_ENOENT : FERRY_EIO, "safetensors: %s: %s",
                            path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    char *idx = path_join(path, "model.safetensors.index.json");
    char *one = path_join(path, "model.safetensors");
    int rc;
    if (!idx || !one) {
      rc = ferry_err_thread(FERRY_ENOMEM, "safetensors: out of memory");
    } else if (stat(idx, &st) == 0) {
      rc = open_index(idx, out);
    } else if (stat(one, &st) == 0) {
      rc = ferry_safetensors_open(one, out);
    } else {
      rc = ferry_err_thread(FERRY_ENOENT, "safetensors: %s holds neither "
                            "model.safetensors.index.json nor model.safetensors", path);
    }
    free(idx);
    free(one);
    return rc;
  }
  if (ends_with(path, ".json")) return open_index(path, out);
  ferry_safetensors *f = st_new(1);
  if (!f || !(f->shards[0].path = strdup(path))) {
    st_free(f);
    return ferry_err_thread(FERRY_ENOMEM, "safetensors: out of memory");
  }
  int rc = open_shard(f, 0);
  if (!rc) rc = build_index(f);
  if (rc) return st_fail(f, rc, out);
  *out = f;
  return 0;
}

void ferry_safetensors_close(ferry_safetensors *f) { st_free(f); }

const char *ferry_safetensors_last_error(const ferry_safetensors *f) {
  return f ? ferry_err_msg(&f->err) : "";
}

size_t ferry_safetensors_count(const ferry_safetensors *f) { return f ? f->nt : 0; }

static void fill_info(const st_entry *e, ferry_st_tensor *o) {
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

int ferry_safetensors_get(const ferry_safetensors *f, size_t i, ferry_st_tensor *out) {
  if (!f || !out) return FERRY_EINVAL;
  if (i >= f->nt)
    return ferry_err((ferry_errbuf *)&f->err, FERRY_EINVAL, "tensor index %zu of %zu", i, f->nt);
  fill_info(&f->t[i], out);
  return 0;
}

int ferry_safetensors_find(const ferry_safetensors *f, const char *name, ferry_st_tensor *out,
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
  if (offset > e->nbytes || bytes > e->nbytes - offset)
    return ferry_err(&f->err, FERRY_EINVAL,
                     "tensor '%.200s': read of %zu bytes at %llu past its %llu bytes", e->name,
                     bytes, (unsigned long long)offset, (unsigned long long)e->nbytes);
  if (!bytes) return 0;
  const st_shard *sh = &f->shards[e->shard];
  if (sh->mem) {
    memcpy(buf, sh->mem + e->offset + offset, bytes);
    return 0;
  }
  int r = pread_full(sh->fd, buf, bytes, e->offset + offset);
  if (r == 1)
    return ferry_err(&f->err, FERRY_ECORRUPT, "%s: tensor '%.200s': file ended early (truncated "
                     "since it was opened)", sh->path, e->name);
  if (r)
    return ferry_err(&f->err, FERRY_EIO, "%s: tensor '%.200s': read: %s", sh->path, e->name,
                     strerror(-r));
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

/* ---- the writer ------------------------------------------------------------- */

typedef struct {
  char *name;
  ferry_st_dtype dtype;
  int ndim;
  int64_t shape[FERRY_ST_MAX_DIMS];
  uint64_t nbytes;
  int shard;
  uint64_t begin;   /* within its shard's data section */
  uint64_t written;
} wt_entry;

typedef struct {
  char *path;
  int fd;
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
      size_t l = utf8_get(p, n, &cp);
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
    size_t l = utf8_get(p, n, &cp);
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

static void writer_cleanup_files(ferry_safetensors_writer *w) {
  for (int i = 0; i < w->nshards; i++) {
    if (w->shards[i].fd >= 0) close(w->shards[i].fd);
    w->shards[i].fd = -1;
    if (!w->finished && w->shards[i].path) unlink(w->shards[i].path);
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
                                 ferry_st_dtype dtype, int ndim, const int64_t *shape) {
  if (!w || !name) return FERRY_EINVAL;
  if (w->laid_out) return ferry_err(&w->err, FERRY_ESTATE, "tensor '%.200s' added after the "
                                    "first write", name);
  if (!name[0] || !valid_utf8(name) || strcmp(name, "__metadata__") == 0)
    return ferry_err(&w->err, FERRY_EINVAL, "tensor name '%.200s' not allowed", name);
  if ((unsigned)dtype >= FERRY_ST_DTYPE_COUNT)
    return ferry_err(&w->err, FERRY_EINVAL, "tensor '%.200s': unknown dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > FERRY_ST_MAX_DIMS || (ndim && !shape))
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
  e->nbytes = numel * ferry_st_dtype_size(dtype);
  w->nt++;
  return 0;
}

/* Hugging Face's order: wider dtypes (later in its enum) first, then name. */
static int cmp_layout(const void *a, const void *b) {
  const wt_entry *x = a, *y = b;
  if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
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

static int io_status(int neg_errno) {
  return neg_errno == -ENOSPC || neg_errno == -EDQUOT ? FERRY_ENOSPC
         : neg_errno == -EACCES || neg_errno == -EPERM ? FERRY_EPERM
         : neg_errno == -ENOENT                        ? FERRY_ENOENT
                                                       : FERRY_EIO;
}

static int layout(ferry_safetensors_writer *w) {
  if (w->failed) return ferry_err(&w->err, FERRY_ESTATE, "writer failed earlier");
  if (w->laid_out) return 0;
  w->laid_out = 1;
  if (w->nt) qsort(w->t, w->nt, sizeof *w->t, cmp_layout);
  /* metadata sorted by key so the header does not depend on call order */
  for (size_t i = 1; i < w->nmeta; i++)
    for (size_t k = i; k > 0 && strcmp(w->mkeys[k - 1], w->mkeys[k]) > 0; k--) {
      char *t = w->mkeys[k];
      w->mkeys[k] = w->mkeys[k - 1];
      w->mkeys[k - 1] = t;
      t = w->mvals[k];
      w->mvals[k] = w->mvals[k - 1];
      w->mvals[k - 1] = t;
    }
  /* shards: greedy in data order */
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
  w->shards = calloc((size_t)ns, sizeof *w->shards);
  if (!w->shards) goto oom;
  w->nshards = ns;
  for (int s = 0; s < ns; s++) w->shards[s].fd = -1;
  if (w->max_shard) {
    if (mkdir(w->path, 0777) == 0) w->made_dir = 1;
    else if (errno != EEXIST) {
      w->failed = 1;
      return ferry_err(&w->err, io_status(-errno), "%s: mkdir: %s", w->path, strerror(errno));
    }
  }
  for (int s = 0; s < ns; s++) {
    char name[64];
    if (!w->max_shard) {
      w->shards[s].path = strdup(w->path);
    } else {
      if (ns == 1) snprintf(name, sizeof name, "model.safetensors");
      else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, ns);
      w->shards[s].path = path_join(w->path, name);
    }
    if (!w->shards[s].path) goto oom;
  }
  for (int s = 0; s < ns; s++) {
    sbuf b = {0};
    sb_put(&b, "{", 1);
    int first = 1;
    if (w->nmeta) {
      sb_str(&b, "\"__metadata__\":{");
      for (size_t i = 0; i < w->nmeta; i++) {
        if (i) sb_put(&b, ",", 1);
        sb_json(&b, w->mkeys[i], 0);
        sb_put(&b, ":", 1);
        sb_json(&b, w->mvals[i], 0);
      }
      sb_put(&b, "}", 1);
      first = 0;
    }
    for (size_t i = 0; i < w->nt; i++) {
      const wt_entry *e = &w->t[i];
      if (e->shard != s) continue;
      if (!first) sb_put(&b, ",", 1);
      first = 0;
      sb_json(&b, e->name, 0);
      sb_str(&b, ":{\"dtype\":\"");
      sb_str(&b, ferry_st_dtype_name(e->dtype));
      sb_str(&b, "\",\"shape\":[");
      for (int d = 0; d < e->ndim; d++) {
        if (d) sb_put(&b, ",", 1);
        sb_u64(&b, (uint64_t)e->shape[d]);
      }
      sb_str(&b, "],\"data_offsets\":[");
      sb_u64(&b, e->begin);
      sb_put(&b, ",", 1);
      sb_u64(&b, e->begin + e->nbytes);
      sb_str(&b, "]}");
      w->shards[s].bytes += e->nbytes;
    }
    sb_put(&b, "}", 1);
    while (!b.oom && b.n % 8) sb_put(&b, " ", 1);
    if (b.oom) {
      free(b.s);
      goto oom;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    wt_shard *sh = &w->shards[s];
    sh->data_start = 8 + b.n;
    sh->fd = open(sh->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int r = sh->fd < 0 ? -errno : 0;
    if (!r) r = write_full(sh->fd, len8, 8, 0);
    if (!r) r = write_full(sh->fd, b.s, b.n, 8);
    free(b.s);
    if (r) {
      w->failed = 1;
      return ferry_err(&w->err, io_status(r), "%s: writing the header: %s", sh->path,
                       strerror(-r));
    }
  }
  w->cur = 0;
  while (w->cur < w->nt && w->t[w->cur].nbytes == 0) w->cur++;
  return 0;
oom:
  w->failed = 1;
  return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
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
                     strerror(-r));
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
  char *path = path_join(w->path, "model.safetensors.index.json");
  if (!path) {
    free(b.s);
    return ferry_err(&w->err, FERRY_ENOMEM, "out of memory");
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  int r = fd < 0 ? -errno : write_full(fd, b.s, b.n, 0);
  if (!r && fsync(fd) != 0) r = -errno;
  if (fd >= 0 && close(fd) != 0 && !r) r = -errno;
  free(b.s);
  if (r) {
    ferry_err(&w->err, io_status(r), "%s: %s", path, strerror(-r));
    unlink(path);
    free(path);
    return io_status(r);
  }
  free(path);
  return 0;
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
  for (int s = 0; s < w->nshards; s++) {
    wt_shard *sh = &w->shards[s];
    int r = fsync(sh->fd) != 0 ? -errno : 0;
    if (close(sh->fd) != 0 && !r) r = -errno;
    sh->fd = -1;
    if (r) {
      w->failed = 1;
      return ferry_err(&w->err, io_status(r), "%s: fsync/close: %s", sh->path, strerror(-r));
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
