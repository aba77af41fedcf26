/* format/checkpoint_manifest.c — the manifest of a checkpoint folder: a
 * small text file, one "key value" line each in a fixed order, listing the
 * training scalars and every file with its size and CRC32C, closed by the
 * CRC32C of the lines above; and the file of per-param step counts it
 * counts (version 5; version 4 has those lines in the manifest). The
 * readers are strict: any other byte is FERRY_ECORRUPT with the line
 * number and the reason.
 */
#include "format/manifest.h"
#include "core/crc32c.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ckpt_manifest_free(ckpt_manifest *m) {
  if (!m) return;
  free(m->files);
  free(m->steps);
  free(m->names);
  memset(m, 0, sizeof *m);
}

/* ---- reader ------------------------------------------------------------ */

typedef struct {
  const char *s;
  size_t len, at;
  int line;
  const char *line_start; /* of the current line */
  size_t line_len;
  char *why;
  size_t why_len;
  const char *file; /* named in refusals */
} mcur;

static int mfail(mcur *c, const char *fmt, ...) FERRY_PRINTF(2, 3);
static int mfail(mcur *c, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->why && c->why_len) snprintf(c->why, c->why_len, "%s line %d: %s", c->file, c->line, msg);
  return FERRY_ECORRUPT;
}

/* The next line, without its '\n' (which it must have). */
static int next_line(mcur *c) {
  c->line++;
  if (c->at >= c->len) return mfail(c, "missing (the file ends early)");
  const char *p = c->s + c->at;
  const char *nl = memchr(p, '\n', c->len - c->at);
  if (!nl) return mfail(c, "no newline at the end");
  c->line_start = p;
  c->line_len = (size_t)(nl - p);
  if (c->line_len > 512) return mfail(c, "longer than 512 bytes");
  for (size_t i = 0; i < c->line_len; i++)
    if ((unsigned char)p[i] < 0x20 || (unsigned char)p[i] > 0x7e)
      return mfail(c, "byte 0x%02x at column %zu (printable ASCII only)", (unsigned char)p[i],
                   i + 1);
  c->at += c->line_len + 1;
  return 0;
}

/* Splits the current line as "key rest": the key must be `key`. */
static int expect_key(mcur *c, const char *key, const char **rest, size_t *rest_len) {
  size_t kl = strlen(key);
  if (c->line_len < kl + 2 || memcmp(c->line_start, key, kl) != 0 || c->line_start[kl] != ' ')
    return mfail(c, "expected \"%s <value>\", found \"%.*s\"", key,
                 (int)(c->line_len > 60 ? 60 : c->line_len), c->line_start);
  *rest = c->line_start + kl + 1;
  *rest_len = c->line_len - kl - 1;
  return 0;
}

/* A decimal number: digits only, no leading zero, at most max. */
static int parse_u64(mcur *c, const char *what, const char *s, size_t n, uint64_t max,
                     uint64_t *out) {
  if (n == 0 || n > 20) return mfail(c, "%s: not a number", what);
  if (n > 1 && s[0] == '0') return mfail(c, "%s: leading zero", what);
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return mfail(c, "%s: '%c' in a number", what, s[i]);
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return mfail(c, "%s: too large", what);
    v = v * 10 + d;
  }
  if (v > max) return mfail(c, "%s: %" PRIu64 " is above the limit %" PRIu64, what, v, max);
  *out = v;
  return 0;
}

/* Exactly 8 lowercase hex digits. */
static int parse_hex32(mcur *c, const char *what, const char *s, size_t n, uint32_t *out) {
  if (n != 8) return mfail(c, "%s: expected 8 hex digits", what);
  uint32_t v = 0;
  for (size_t i = 0; i < 8; i++) {
    int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10 : -1;
    if (d < 0) return mfail(c, "%s: '%c' is not a lowercase hex digit", what, s[i]);
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return 0;
}

static int key_u64(mcur *c, const char *key, uint64_t max, uint64_t *out) {
  const char *r;
  size_t n;
  int rc = next_line(c);
  if (!rc) rc = expect_key(c, key, &r, &n);
  if (!rc) rc = parse_u64(c, key, r, n, max, out);
  return rc;
}

/* A word of [a-z0-9] (lowercase names) or [A-Z0-9] (dtype names). */
static int key_word(mcur *c, const char *key, char *out, size_t cap) {
  const char *r;
  size_t n;
  int rc = next_line(c);
  if (!rc) rc = expect_key(c, key, &r, &n);
  if (rc) return rc;
  if (n >= cap) return mfail(c, "%s: longer than %zu bytes", key, cap - 1);
  for (size_t i = 0; i < n; i++)
    if (!((r[i] >= 'a' && r[i] <= 'z') || (r[i] >= 'A' && r[i] <= 'Z') ||
          (r[i] >= '0' && r[i] <= '9')))
      return mfail(c, "%s: '%c' in a name", key, r[i]);
  memcpy(out, r, n);
  out[n] = 0;
  return 0;
}

/* A relative path of [A-Za-z0-9._-] components, none empty, "." or "..". */
static int check_path(mcur *c, const char *p, size_t n) {
  if (n == 0 || n > CKPT_PATH_MAX) return mfail(c, "file path of %zu bytes (1..%d)", n, CKPT_PATH_MAX);
  size_t comp = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || p[i] == '/') {
      if (comp == 0) return mfail(c, "file path \"%.*s\" has an empty component", (int)n, p);
      if ((comp == 1 && p[i - 1] == '.') || (comp == 2 && p[i - 1] == '.' && p[i - 2] == '.'))
        return mfail(c, "file path \"%.*s\" has a \".\" or \"..\" component", (int)n, p);
      comp = 0;
      continue;
    }
    char ch = p[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-'))
      return mfail(c, "file path \"%.*s\": '%c' is not allowed", (int)n, p, ch);
    comp++;
  }
  return 0;
}

/* The first line: "ferry-checkpoint <version>", the version this ferry reads. */
static int parse_magic(mcur *c, ckpt_manifest *m) {
  int rc = next_line(c);
  if (rc) return rc;
  static const char magic[] = "ferry-checkpoint ";
  if (c->line_len < sizeof magic || memcmp(c->line_start, magic, sizeof magic - 1) != 0)
    return mfail(c, "not a ferry checkpoint manifest (no \"ferry-checkpoint <version>\")");
  uint64_t v;
  rc = parse_u64(c, "version", c->line_start + sizeof magic - 1, c->line_len - (sizeof magic - 1),
                 UINT32_MAX, &v);
  if (rc) return rc;
  if (v < 1 || v > CKPT_FORMAT_VERSION)
    return mfail(c, "format version %" PRIu64 " (this ferry reads versions 1 to %d)", v,
                 CKPT_FORMAT_VERSION);
  m->version = (int)v;
  return 0;
}

/* Version 2's optimizer layout lines (version 1 has none: fp32 states and
 * master), then version 3's ranks lines (before it: one rank). */
static int parse_layout(mcur *c, ckpt_manifest *m) {
  m->ranks = 1;
  m->zero_stage = 0;
  if (m->version == 1) {
    snprintf(m->state_dtype, sizeof m->state_dtype, "F32");
    snprintf(m->master_dtype, sizeof m->master_dtype, "F32");
    m->state_block = 256;
    return 0;
  }
  int rc;
  if ((rc = key_word(c, "optimizer_state_dtype", m->state_dtype, sizeof m->state_dtype)))
    return rc;
  if (strcmp(m->state_dtype, "F32") && strcmp(m->state_dtype, "BF16") &&
      strcmp(m->state_dtype, "I8"))
    return mfail(c, "optimizer_state_dtype \"%s\" (F32, BF16 or I8)", m->state_dtype);
  if ((rc = key_u64(c, "optimizer_state_block", 4096, &m->state_block))) return rc;
  if (m->state_block < 32 || (m->state_block & (m->state_block - 1)))
    return mfail(c, "optimizer_state_block %" PRIu64 " (a power of two in [32, 4096])",
                 m->state_block);
  if ((rc = key_word(c, "master_dtype", m->master_dtype, sizeof m->master_dtype))) return rc;
  if (strcmp(m->master_dtype, "F32") && strcmp(m->master_dtype, "BF16"))
    return mfail(c, "master_dtype \"%s\" (F32 or BF16)", m->master_dtype);
  if (m->version < 3) return 0;
  if ((rc = key_u64(c, "ranks", 1u << 20, &m->ranks))) return rc;
  if (m->ranks < 1) return mfail(c, "ranks 0 (at least 1)");
  return key_u64(c, "zero_stage", 3, &m->zero_stage);
}

/* The scalar lines, "step" to "files", in their fixed order; *nfiles: the
 * count the "files" line gives. */
static int parse_scalars(mcur *c, ckpt_manifest *m, uint64_t *nfiles) {
  uint64_t step, states, good, skipped, tensors, blob;
  const char *r;
  size_t n;
  int rc;
  if ((rc = key_u64(c, "step", (uint64_t)FERRY_STEP_MAX, &step))) return rc;
  if ((rc = key_word(c, "param_dtype", m->param_dtype, sizeof m->param_dtype))) return rc;
  if (strcmp(m->param_dtype, "F32") && strcmp(m->param_dtype, "F16") &&
      strcmp(m->param_dtype, "BF16"))
    return mfail(c, "param_dtype \"%s\" (F32, F16 or BF16)", m->param_dtype);
  if ((rc = key_word(c, "optimizer", m->optimizer, sizeof m->optimizer))) return rc;
  if ((rc = key_u64(c, "optimizer_states", 2, &states))) return rc;
  if ((rc = parse_layout(c, m))) return rc;
  if ((rc = next_line(c)) || (rc = expect_key(c, "loss_scale", &r, &n)) ||
      (rc = parse_hex32(c, "loss_scale", r, n, &m->loss_scale_bits)))
    return rc;
  /* counts that go on from here: one more step must still fit (an int for
   * good steps) */
  if ((rc = key_u64(c, "loss_scale_good_steps", INT32_MAX - 1, &good))) return rc;
  if ((rc = key_u64(c, "loss_scale_skipped", (uint64_t)FERRY_STEP_MAX, &skipped))) return rc;
  if ((rc = key_u64(c, "tensors", 1u << 30, &tensors))) return rc;
  if ((rc = key_u64(c, "blob_bytes", CKPT_MAX_BLOB, &blob))) return rc;
  if ((rc = key_u64(c, "files", CKPT_MAX_FILES, nfiles))) return rc;
  m->step = (int64_t)step;
  m->states = (int)states;
  m->good_steps = (int64_t)good;
  m->skipped = (int64_t)skipped;
  m->tensors = tensors;
  m->blob_bytes = blob;
  return 0;
}

/* The i-th "file <path> <bytes> <crc32c>" line into m->files[i]; paths
 * strictly increase. */
static int parse_file_line(mcur *c, ckpt_manifest *m, size_t i) {
  const char *r;
  size_t n;
  int rc;
  if ((rc = next_line(c)) || (rc = expect_key(c, "file", &r, &n))) return rc;
  const char *sp1 = memchr(r, ' ', n);
  if (!sp1) return mfail(c, "expected \"file <path> <bytes> <crc32c>\"");
  const char *sz = sp1 + 1;
  const char *sp2 = memchr(sz, ' ', (size_t)(r + n - sz));
  if (!sp2) return mfail(c, "expected \"file <path> <bytes> <crc32c>\"");
  const char *hx = sp2 + 1;
  size_t plen = (size_t)(sp1 - r);
  if ((rc = check_path(c, r, plen))) return rc;
  uint64_t bytes;
  if ((rc = parse_u64(c, "file size", sz, (size_t)(sp2 - sz), CKPT_MAX_FILE_BYTES, &bytes)))
    return rc;
  if ((rc = parse_hex32(c, "file crc32c", hx, (size_t)(r + n - hx), &m->files[i].crc)))
    return rc;
  memcpy(m->files[i].path, r, plen);
  m->files[i].path[plen] = 0;
  m->files[i].bytes = bytes;
  if (i > 0 && strcmp(m->files[i - 1].path, m->files[i].path) >= 0)
    return mfail(c, "file \"%s\" is out of order or listed twice (paths are sorted)",
                 m->files[i].path);
  return 0;
}

/* qsort: steps by name, then by their place in the list. */
static int by_name(const void *a, const void *b) {
  const ckpt_param_step *x = *(const ckpt_param_step *const *)a;
  const ckpt_param_step *y = *(const ckpt_param_step *const *)b;
  int d = strcmp(x->name, y->name);
  return d ? d : (x > y) - (x < y);
}

/* Each of the n step lines parsed (the last one c's line) names its own
 * param: a second count for one name would leave the param the line's
 * index hints at with the step's count. The first line that repeats a
 * name is refused, naming it and the line that named it first. The load
 * and verify share this rule. */
static int check_unique_names(mcur *c, const ckpt_param_step *steps, size_t n) {
  if (n < 2) return 0;
  const ckpt_param_step **v = malloc(n * sizeof *v);
  if (!v) return FERRY_ENOMEM;
  for (size_t i = 0; i < n; i++) v[i] = &steps[i];
  qsort(v, n, sizeof *v, by_name);
  const ckpt_param_step *again = NULL, *first = NULL;
  for (size_t i = 1; i < n; i++) /* a run's first two: the name's first and second lines */
    if (!strcmp(v[i - 1]->name, v[i]->name) && (i < 2 || strcmp(v[i - 2]->name, v[i]->name)) &&
        (!again || v[i] < again))
      again = v[i], first = v[i - 1];
  free(v);
  if (!again) return 0;
  int last = c->line;
  c->line = last - (int)(n - 1 - (size_t)(again - steps));
  return mfail(c, "param_step %" PRIu64 " names '%.150s' a second time (line %d names it first)",
               again->index, again->name, last - (int)(n - 1 - (size_t)(first - steps)));
}

/* n lines "param_step <index> <steps> <name>" into m->steps (indices
 * increasing, below tensors; each count at most the step; the name the
 * rest of the line, printable as every line is; each name once), its
 * names into m->names (no larger than the text left). */
static int parse_step_lines(mcur *c, ckpt_manifest *m, uint64_t n) {
  if (n > (c->len - c->at) / 17 + 1)
    return mfail(c, "param_steps %" PRIu64 ": more than the %s can list", n, c->file);
  m->steps = calloc(n ? n : 1, sizeof *m->steps);
  m->names = malloc(c->len - c->at + 1);
  if (!m->steps || !m->names) return FERRY_ENOMEM;
  m->nsteps = n;
  size_t pool = 0;
  for (size_t i = 0; i < n; i++) {
    const char *r;
    size_t len;
    int rc;
    if ((rc = next_line(c)) || (rc = expect_key(c, "param_step", &r, &len))) return rc;
    const char *sp = memchr(r, ' ', len);
    const char *sp2 = sp ? memchr(sp + 1, ' ', (size_t)(r + len - sp - 1)) : NULL;
    if (!sp2) return mfail(c, "expected \"param_step <index> <steps> <name>\"");
    size_t nlen = (size_t)(r + len - sp2 - 1);
    if (nlen == 0 || nlen > CKPT_NAME_MAX)
      return mfail(c, "param_step: a name of %zu bytes (1 to %d)", nlen, CKPT_NAME_MAX);
    uint64_t idx, st;
    if ((rc = parse_u64(c, "param_step index", r, (size_t)(sp - r), UINT64_MAX, &idx)) ||
        (rc = parse_u64(c, "param_step count", sp + 1, (size_t)(sp2 - sp - 1),
                        (uint64_t)FERRY_STEP_MAX, &st)))
      return rc;
    memcpy(m->names + pool, sp2 + 1, nlen); /* (each name is shorter than its line) */
    m->names[pool + nlen] = 0;
    m->steps[i].name = m->names + pool;
    pool += nlen + 1;
    if (idx >= m->tensors)
      return mfail(c, "param_step index %" PRIu64 ": the checkpoint has %" PRIu64 " params", idx,
                   m->tensors);
    if (i > 0 && idx <= m->steps[i - 1].index)
      return mfail(c, "param_step index %" PRIu64 " is out of order or listed twice", idx);
    if (st > (uint64_t)m->step)
      return mfail(c, "param_step %" PRIu64 ": step count %" PRIu64 " is above the checkpoint's "
                   "step %" PRId64, idx, st, m->step);
    m->steps[i].index = idx;
    m->steps[i].steps = (int64_t)st;
  }
  return check_unique_names(c, m->steps, n);
}

/* Versions 4 and 5: "param_steps <n>"; version 4 then has the n lines
 * (parse_step_lines), version 5 has them in the file CKPT_STEPS_NAME and
 * at least one. */
static int parse_param_steps(mcur *c, ckpt_manifest *m) {
  if (m->version < 4) return 0;
  int rc = key_u64(c, "param_steps", m->tensors, &m->steps_listed);
  if (rc) return rc;
  if (m->version == 4) return parse_step_lines(c, m, m->steps_listed);
  if (m->steps_listed == 0) return mfail(c, "param_steps 0 (version 5 lists at least one)");
  return 0;
}

/* The last line, "crc32c <hex>": nothing after it and, with check_crc,
 * the CRC32C of every byte before it. */
static int parse_crc_line(mcur *c, int check_crc) {
  size_t body = c->at; /* bytes covered by the CRC */
  const char *r;
  size_t n;
  uint32_t crc;
  int rc;
  if ((rc = next_line(c)) || (rc = expect_key(c, "crc32c", &r, &n)) ||
      (rc = parse_hex32(c, "crc32c", r, n, &crc)))
    return rc;
  if (c->at != c->len) {
    c->line++;
    return mfail(c, "%zu bytes after the crc32c line", c->len - c->at);
  }
  if (check_crc) {
    uint32_t got = ferry_crc32c(0, c->s, body);
    if (got != crc)
      return mfail(c, "the manifest's CRC32C is %08x, its last line says %08x (damaged)", got, crc);
  }
  return 0;
}

int ckpt_manifest_parse(const char *text, size_t len, int check_crc, ckpt_manifest *out,
                        char *why, size_t why_len) {
  if (why && why_len) why[0] = 0;
  if (!out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  mcur c = {text, text ? len : 0, 0, 0, NULL, 0, why, why_len, "manifest"};
  if (!text || len == 0) return mfail(&c, "the manifest is empty");
  if (len > CKPT_MANIFEST_MAX) return mfail(&c, "the manifest is %zu bytes (at most %u)", len, CKPT_MANIFEST_MAX);
  ckpt_manifest m;
  memset(&m, 0, sizeof m);
  uint64_t nfiles = 0;
  int rc = parse_magic(&c, &m);
  if (!rc) rc = parse_scalars(&c, &m, &nfiles);
  if (rc) return rc;
  /* the file list can hold no more lines than the text has */
  if (nfiles > len / 16 + 1) return mfail(&c, "files %" PRIu64 ": more than the manifest can list", nfiles);
  m.files = calloc(nfiles ? nfiles : 1, sizeof *m.files);
  if (!m.files) {
    if (why && why_len) snprintf(why, why_len, "manifest: out of memory");
    return FERRY_ENOMEM;
  }
  m.nfiles = nfiles;
  for (size_t i = 0; i < nfiles && !rc; i++) rc = parse_file_line(&c, &m, i);
  if (!rc) rc = parse_param_steps(&c, &m);
  if (!rc) rc = parse_crc_line(&c, check_crc);
  if (rc == FERRY_ENOMEM && why && why_len) snprintf(why, why_len, "manifest: out of memory");
  if (rc) {
    ckpt_manifest_free(&m);
    return rc;
  }
  *out = m;
  return FERRY_OK;
}

uint64_t ckpt_param_steps_limit(const ckpt_manifest *m) {
  uint64_t n = m->steps_listed;
  return n > CKPT_STEPS_MAX / CKPT_STEP_LINE_MAX ? CKPT_STEPS_MAX : n * CKPT_STEP_LINE_MAX;
}

int ckpt_param_steps_parse(const char *text, size_t len, ckpt_manifest *m, char *why,
                           size_t why_len) {
  if (why && why_len) why[0] = 0;
  mcur c = {text, text ? len : 0, 0, 0, NULL, 0, why, why_len, CKPT_STEPS_NAME};
  if (!m || m->version < 5 || m->nsteps || m->steps) return FERRY_EINVAL;
  if (len > ckpt_param_steps_limit(m))
    return mfail(&c, "the file is %zu bytes, more than %" PRIu64 " for the manifest's %" PRIu64
                 " params (at most %d bytes a line, %llu in all)", len, ckpt_param_steps_limit(m),
                 m->steps_listed, CKPT_STEP_LINE_MAX, (unsigned long long)CKPT_STEPS_MAX);
  int rc = parse_step_lines(&c, m, m->steps_listed);
  if (!rc && c.at != c.len) {
    c.line++;
    rc = mfail(&c, "%zu bytes after the manifest's %" PRIu64 " lines", c.len - c.at,
               m->steps_listed);
  }
  if (rc == FERRY_ENOMEM && why && why_len) snprintf(why, why_len, "%s: out of memory", c.file);
  if (rc) {
    free(m->steps);
    free(m->names);
    m->steps = NULL;
    m->names = NULL;
    m->nsteps = 0;
  }
  return rc;
}

/* ---- writer ------------------------------------------------------------ */

int ckpt_manifest_format(const ckpt_manifest *m, char **text, size_t *len) {
  if (!m || !text || !len) return FERRY_EINVAL;
  size_t cap = 1024 + m->nfiles * (CKPT_PATH_MAX + 48);
  char *s = malloc(cap);
  if (!s) return FERRY_ENOMEM;
  int n = snprintf(s, cap,
                   "ferry-checkpoint %d\n"
                   "step %" PRId64 "\n"
                   "param_dtype %s\n"
                   "optimizer %s\n"
                   "optimizer_states %d\n"
                   "optimizer_state_dtype %s\n"
                   "optimizer_state_block %" PRIu64 "\n"
                   "master_dtype %s\n"
                   "ranks %" PRIu64 "\n"
                   "zero_stage %" PRIu64 "\n"
                   "loss_scale %08" PRIx32 "\n"
                   "loss_scale_good_steps %" PRId64 "\n"
                   "loss_scale_skipped %" PRId64 "\n"
                   "tensors %" PRIu64 "\n"
                   "blob_bytes %" PRIu64 "\n"
                   "files %zu\n",
                   m->steps_listed ? 5 : 3, m->step, m->param_dtype, m->optimizer, m->states,
                   m->state_dtype, m->state_block, m->master_dtype, m->ranks ? m->ranks : 1,
                   m->zero_stage, m->loss_scale_bits, m->good_steps, m->skipped, m->tensors, m->blob_bytes,
                   m->nfiles);
  size_t at = (size_t)n;
  for (size_t i = 0; i < m->nfiles; i++)
    at += (size_t)snprintf(s + at, cap - at, "file %s %" PRIu64 " %08" PRIx32 "\n", m->files[i].path,
                           m->files[i].bytes, m->files[i].crc);
  if (m->steps_listed)
    at += (size_t)snprintf(s + at, cap - at, "param_steps %" PRIu64 "\n", m->steps_listed);
  uint32_t crc = ferry_crc32c(0, s, at);
  at += (size_t)snprintf(s + at, cap - at, "crc32c %08" PRIx32 "\n", crc);
  *text = s;
  *len = at;
  return FERRY_OK;
}

/* Step i's line into s (cap bytes, NULL 0: none); its length. */
static size_t step_line(const ckpt_manifest *m, size_t i, char *s, size_t cap) {
  return (size_t)snprintf(s, cap, "param_step %" PRIu64 " %" PRId64 " %.*s\n", m->steps[i].index,
                          m->steps[i].steps, CKPT_NAME_MAX, m->steps[i].name);
}

uint64_t ckpt_param_steps_bytes(const ckpt_manifest *m) {
  uint64_t n = 0;
  for (size_t i = 0; i < m->nsteps; i++) n += step_line(m, i, NULL, 0);
  return n;
}

int ckpt_param_steps_format(const ckpt_manifest *m, char **text, size_t *len) {
  if (!m || !text || !len) return FERRY_EINVAL;
  uint64_t bytes = ckpt_param_steps_bytes(m);
  if (bytes >= SIZE_MAX) return FERRY_ENOMEM;
  size_t cap = (size_t)bytes + 1, at = 0;
  char *s = malloc(cap);
  if (!s) return FERRY_ENOMEM;
  s[0] = 0;
  for (size_t i = 0; i < m->nsteps; i++) at += step_line(m, i, s + at, cap - at);
  *text = s;
  *len = at;
  return FERRY_OK;
}
