/* tests/offload/test_safetensors.c — the safetensors reader and writer: a
 * file from Hugging Face's writer read and re-written byte for byte,
 * write -> read -> write identity, streamed pieces, sharded models with an
 * index, and every kind of hostile header refused with FERRY_ECORRUPT and
 * the reason. argv[1]: tests/fixtures, argv[2]: a scratch directory.
 */
#include "ferry.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_fix, *g_tmp;

static unsigned char pat(uint64_t j, int seed) { return (unsigned char)((31 * j + 7 * seed + 1) & 0xff); }

typedef struct {
  const char *name;
  ferry_dtype dtype;
  int ndim;
  int64_t shape[3];
  int seed;
} spec;

/* the table of tests/fixtures/gen_safetensors.py */
static const spec k_small[] = {
    {"a.weight", FERRY_DT_F32, 2, {3, 4}, 0}, {"b.bias", FERRY_DT_F16, 1, {5}, 1},
    {"c", FERRY_DT_BF16, 2, {2, 3}, 2},       {"d", FERRY_DT_I64, 1, {2}, 3},
    {"e", FERRY_DT_U8, 1, {7}, 4},            {"scalar", FERRY_DT_F32, 0, {0}, 5},
    {"empty", FERRY_DT_F32, 2, {0, 4}, 6},    {"z.i32", FERRY_DT_I32, 1, {3}, 7},
};
#define NSMALL (sizeof k_small / sizeof k_small[0])

static uint64_t spec_bytes(const spec *s) {
  uint64_t n = ferry_dtype_size(s->dtype);
  for (int d = 0; d < s->ndim; d++) n *= (uint64_t)s->shape[d];
  return n;
}

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return b;
}

static int same_file(const char *a, const char *b) {
  size_t la, lb;
  unsigned char *x = slurp(a, &la), *y = slurp(b, &lb);
  int same = x && y && la == lb && memcmp(x, y, la) == 0;
  if (!same) fprintf(stderr, "files differ: %s (%zu) %s (%zu)\n", a, x ? la : 0, b, y ? lb : 0);
  free(x);
  free(y);
  return same;
}

static char *pth(const char *dir, const char *name) {
  static char bufs[8][1024];
  static int k;
  char *b = bufs[k++ % 8];
  if (snprintf(b, 1024, "%s/%s", dir, name) >= 1024) abort();
  return b;
}

/* Writes the specs (declared in reverse, to show order does not matter), the
 * data in pieces of `piece` bytes. */
static int write_specs(const char *path, uint64_t shard, const spec *s, size_t n, size_t piece,
                       int meta) {
  ferry_safetensors_writer *w;
  int rc = ferry_safetensors_writer_create(path, shard, &w);
  if (rc) return rc;
  if (meta) EXPECT_EQ_INT(ferry_safetensors_writer_metadata(w, "format", "pt"), 0);
  for (size_t i = n; i-- > 0;)
    EXPECT_EQ_INT(ferry_safetensors_writer_add(w, s[i].name, s[i].dtype, s[i].ndim, s[i].shape), 0);
  const char *next;
  while ((next = ferry_safetensors_writer_next(w))) {
    const spec *t = NULL;
    for (size_t i = 0; i < n; i++)
      if (strcmp(s[i].name, next) == 0) t = &s[i];
    REQUIRE(t);
    uint64_t nb = spec_bytes(t);
    unsigned char *buf = malloc(nb);
    for (uint64_t j = 0; j < nb; j++) buf[j] = pat(j, t->seed);
    for (uint64_t at = 0; at < nb; at += piece) {
      size_t k = nb - at < piece ? (size_t)(nb - at) : piece;
      rc = ferry_safetensors_writer_write(w, next, buf + at, k);
      if (rc) fprintf(stderr, "write: %s\n", ferry_safetensors_writer_last_error(w));
      EXPECT_EQ_INT(rc, 0);
    }
    free(buf);
  }
  rc = ferry_safetensors_writer_finish(w);
  if (rc) fprintf(stderr, "finish: %s\n", ferry_safetensors_writer_last_error(w));
  ferry_safetensors_writer_destroy(w);
  return rc;
}

static void check_contents(ferry_safetensors *f, const spec *s, size_t n) {
  EXPECT_EQ_INT(ferry_safetensors_count(f), n);
  for (size_t i = 0; i < n; i++) {
    ferry_safetensors_tensor t;
    size_t idx;
    int rc = ferry_safetensors_find(f, s[i].name, &t, &idx);
    EXPECT_EQ_INT(rc, 0);
    if (rc) continue;
    EXPECT(t.dtype == s[i].dtype);
    EXPECT_EQ_INT(t.ndim, s[i].ndim);
    for (int d = 0; d < t.ndim; d++) EXPECT_EQ_INT(t.shape[d], s[i].shape[d]);
    EXPECT_EQ_INT(t.nbytes, spec_bytes(&s[i]));
    unsigned char *buf = malloc(t.nbytes + 1);
    /* whole, then in two pieces from an offset */
    EXPECT_EQ_INT(ferry_safetensors_read(f, idx, 0, buf, t.nbytes), 0);
    for (uint64_t j = 0; j < t.nbytes; j++)
      if (buf[j] != pat(j, s[i].seed)) {
        fprintf(stderr, "%s: byte %llu differs\n", s[i].name, (unsigned long long)j);
        test_failures++;
        break;
      }
    if (t.nbytes > 3) {
      unsigned char b2[2];
      EXPECT_EQ_INT(ferry_safetensors_read(f, idx, 1, b2, 2), 0);
      EXPECT(b2[0] == pat(1, s[i].seed) && b2[1] == pat(2, s[i].seed));
    }
    EXPECT_EQ_INT(ferry_safetensors_read(f, idx, t.nbytes, buf, 1), FERRY_EINVAL);
    free(buf);
  }
  EXPECT_EQ_INT(ferry_safetensors_find(f, "nope", NULL, NULL), FERRY_ENOENT);
}

static void test_hf_fixture(void) {
  ferry_safetensors *f;
  char hf[1024];
  if (snprintf(hf, sizeof hf, "%s/hf_small.safetensors", g_fix) >= (int)sizeof hf) abort();
  int rc = ferry_safetensors_open(hf, &f);
  if (rc) fprintf(stderr, "%s\n", ferry_last_error());
  REQUIRE(rc == 0);
  check_contents(f, k_small, NSMALL);
  EXPECT(ferry_safetensors_metadata_count(f) == 1);
  const char *v = ferry_safetensors_metadata_find(f, "format");
  EXPECT(v && strcmp(v, "pt") == 0);
  /* file order is data order: Hugging Face puts I64 first */
  ferry_safetensors_tensor t0;
  EXPECT_EQ_INT(ferry_safetensors_get(f, 0, &t0), 0);
  EXPECT(strcmp(t0.name, "d") == 0);
  ferry_safetensors_close(f);

  /* our writer makes the very same bytes */
  const char *ours = pth(g_tmp, "ours_small.safetensors");
  EXPECT_EQ_INT(write_specs(ours, 0, k_small, NSMALL, 5, 1), 0);
  EXPECT(same_file(hf, ours));
}

/* Reads any file and writes it again through the writer, as a copy would. */
static int copy_file(const char *src, const char *dst, uint64_t shard) {
  ferry_safetensors *f;
  int rc = ferry_safetensors_open(src, &f);
  if (rc) {
    fprintf(stderr, "%s\n", ferry_last_error());
    return rc;
  }
  ferry_safetensors_writer *w;
  REQUIRE(ferry_safetensors_writer_create(dst, shard, &w) == 0);
  for (size_t i = 0; i < ferry_safetensors_metadata_count(f); i++) {
    const char *k, *v;
    ferry_safetensors_metadata_get(f, i, &k, &v);
    EXPECT_EQ_INT(ferry_safetensors_writer_metadata(w, k, v), 0);
  }
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    ferry_safetensors_get(f, i, &t);
    EXPECT_EQ_INT(ferry_safetensors_writer_add(w, t.name, t.dtype, t.ndim, t.shape), 0);
  }
  const char *next;
  while ((next = ferry_safetensors_writer_next(w))) {
    ferry_safetensors_tensor t;
    size_t idx;
    REQUIRE(ferry_safetensors_find(f, next, &t, &idx) == 0);
    unsigned char buf[7];
    for (uint64_t at = 0; at < t.nbytes; at += sizeof buf) { /* odd pieces on purpose */
      size_t k = t.nbytes - at < sizeof buf ? (size_t)(t.nbytes - at) : sizeof buf;
      REQUIRE(ferry_safetensors_read(f, idx, at, buf, k) == 0);
      REQUIRE(ferry_safetensors_writer_write(w, next, buf, k) == 0);
    }
  }
  rc = ferry_safetensors_writer_finish(w);
  ferry_safetensors_writer_destroy(w);
  ferry_safetensors_close(f);
  return rc;
}

static void test_roundtrip(void) {
  const char *a = pth(g_tmp, "rt_a.safetensors"), *b = pth(g_tmp, "rt_b.safetensors"),
             *c = pth(g_tmp, "rt_c.safetensors");
  /* names needing escapes and non-ASCII, no metadata */
  static const spec odd[] = {
      {"q\"uo\\te", FERRY_DT_F32, 1, {2}, 1},
      {"tab\there\n", FERRY_DT_BF16, 2, {1, 3}, 2},
      {"caf\xc3\xa9.\xf0\x9f\x98\x80", FERRY_DT_U16, 1, {4}, 3},
      {"ctl\x01", FERRY_DT_F64, 1, {1}, 4},
  };
  EXPECT_EQ_INT(write_specs(a, 0, odd, 4, 3, 0), 0);
  EXPECT_EQ_INT(copy_file(a, b, 0), 0);
  EXPECT_EQ_INT(copy_file(b, c, 0), 0);
  EXPECT(same_file(a, b));
  EXPECT(same_file(b, c));
  ferry_safetensors *f;
  REQUIRE(ferry_safetensors_open(a, &f) == 0);
  check_contents(f, odd, 4);
  EXPECT(ferry_safetensors_metadata_count(f) == 0);
  ferry_safetensors_close(f);
  /* a file of no tensors at all */
  const char *e = pth(g_tmp, "rt_empty.safetensors");
  EXPECT_EQ_INT(write_specs(e, 0, odd, 0, 1, 0), 0);
  REQUIRE(ferry_safetensors_open(e, &f) == 0);
  EXPECT(ferry_safetensors_count(f) == 0);
  ferry_safetensors_close(f);
}

static const spec k_sharded[] = {
    {"layer.0.w", FERRY_DT_F32, 2, {4, 8}, 10}, {"layer.1.w", FERRY_DT_F32, 2, {4, 8}, 11},
    {"layer.2.w", FERRY_DT_F32, 2, {4, 8}, 12}, {"layer.3.w", FERRY_DT_F32, 2, {4, 8}, 13},
    {"layer.4.w", FERRY_DT_F32, 2, {4, 8}, 14},
};

static void test_sharded(void) {
  char hfdir[1024];
  if (snprintf(hfdir, sizeof hfdir, "%s/hf_sharded", g_fix) >= (int)sizeof hfdir) abort();
  ferry_safetensors *f;
  int rc = ferry_safetensors_open(hfdir, &f);
  if (rc) fprintf(stderr, "%s\n", ferry_last_error());
  REQUIRE(rc == 0);
  EXPECT_EQ_INT(ferry_safetensors_shard_count(f), 3);
  check_contents(f, k_sharded, 5);
  ferry_safetensors_close(f);

  char ours[1024];
  if (snprintf(ours, sizeof ours, "%s/ours_sharded", g_tmp) >= (int)sizeof ours) abort();
  EXPECT_EQ_INT(write_specs(ours, 300, k_sharded, 5, 64, 1), 0);
  const char *names[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
  for (int i = 0; i < 4; i++) EXPECT(same_file(pth(hfdir, names[i]), pth(ours, names[i])));
  /* the index path itself opens too; a copy through the reader is identical */
  REQUIRE(ferry_safetensors_open(pth(ours, "model.safetensors.index.json"), &f) == 0);
  check_contents(f, k_sharded, 5);
  ferry_safetensors_close(f);
  char again[1024];
  if (snprintf(again, sizeof again, "%s/ours_sharded2", g_tmp) >= (int)sizeof again) abort();
  EXPECT_EQ_INT(copy_file(ours, again, 300), 0);
  for (int i = 0; i < 4; i++) EXPECT(same_file(pth(ours, names[i]), pth(again, names[i])));
  /* a limit everything fits under gives one model.safetensors, no index */
  char one[1024];
  if (snprintf(one, sizeof one, "%s/ours_one", g_tmp) >= (int)sizeof one) abort();
  EXPECT_EQ_INT(write_specs(one, 1 << 20, k_sharded, 5, 64, 1), 0);
  EXPECT(access(pth(one, "model.safetensors"), F_OK) == 0);
  EXPECT(access(pth(one, "model.safetensors.index.json"), F_OK) != 0);
  REQUIRE(ferry_safetensors_open(one, &f) == 0);
  check_contents(f, k_sharded, 5);
  ferry_safetensors_close(f);

  /* an index that disagrees with its shards */
  char bad[1024];
  if (snprintf(bad, sizeof bad, "%s/bad_index", g_tmp) >= (int)sizeof bad) abort();
  mkdir(bad, 0777);
  for (int i = 0; i < 3; i++) {
    size_t n;
    unsigned char *b = slurp(pth(ours, names[i]), &n);
    FILE *o = fopen(pth(bad, names[i]), "wb");
    fwrite(b, 1, n, o);
    fclose(o);
    free(b);
  }
  struct {
    const char *json, *why;
  } cases[] = {
      {"{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00003.safetensors\"}}", "hold 2 tensors"},
      {"{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00003.safetensors\", \"layer.1.w\": "
       "\"model-00001-of-00003.safetensors\", \"layer.9.w\": \"model-00001-of-00003.safetensors\"}}",
       "layer.9.w"},
      {"{\"weight_map\": {\"layer.0.w\": \"../x.safetensors\"}}", "not a plain file name"},
      {"{\"weight_map\": {\"a\": \"m.safetensors\", \"a\": \"m.safetensors\"}}", "given twice"},
      {"{\"metadata\": {}}", "no \"weight_map\""},
      {"{\"weight_map\": {\"layer.0.w\": \"gone.safetensors\"}}", "gone.safetensors"},
      {"{\"weight_map\": [}", "bad JSON"},
      {"{\"weight_map\": {\"layer.2.w\": \"model-00001-of-00003.safetensors\", \"layer.0.w\": "
       "\"model-00001-of-00003.safetensors\", \"layer.1.w\": \"model-00002-of-00003.safetensors\", "
       "\"layer.3.w\": \"model-00002-of-00003.safetensors\"}}",
       "mapped to"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *o = fopen(pth(bad, "model.safetensors.index.json"), "w");
    fputs(cases[i].json, o);
    fclose(o);
    rc = ferry_safetensors_open(bad, &f);
    EXPECT(rc != 0 && f == NULL);
    if (!strstr(ferry_last_error(), cases[i].why)) {
      fprintf(stderr, "index case %zu: message '%s' lacks '%s'\n", i, ferry_last_error(),
              cases[i].why);
      test_failures++;
    }
  }
}

/* A file from a header text and `data` bytes of body. */
static unsigned char *mk(const char *hdr, size_t data, size_t *len) {
  size_t n = strlen(hdr);
  *len = 8 + n + data;
  unsigned char *b = calloc(1, *len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, n);
  return b;
}

static void expect_refused(const unsigned char *b, size_t len, const char *why, int line) {
  ferry_safetensors *f = (ferry_safetensors *)1;
  int rc = ferry_safetensors_open_memory(b, len, &f);
  if (rc != FERRY_ECORRUPT || f != NULL || !strstr(ferry_last_error(), why)) {
    fprintf(stderr, "line %d: rc %d, message '%s', wanted ECORRUPT and '%s'\n", line, rc,
            ferry_last_error(), why);
    test_failures++;
  }
  if (rc == 0) ferry_safetensors_close(f);
}

#define REFUSE_HDR(hdr, data, why)                     \
  do {                                                 \
    size_t l_;                                         \
    unsigned char *b_ = mk(hdr, data, &l_);            \
    expect_refused(b_, l_, why, __LINE__);             \
    free(b_);                                          \
  } while (0)

static void test_hostile(void) {
  unsigned char raw[16] = {0};
  expect_refused(raw, 0, "shorter than", __LINE__);
  expect_refused(raw, 7, "shorter than", __LINE__);
  /* header length 0, 1, huge, past EOF */
  expect_refused(raw, 16, "out of range", __LINE__);
  raw[0] = 1;
  expect_refused(raw, 16, "out of range", __LINE__);
  memset(raw, 0xff, 8);
  expect_refused(raw, 16, "out of range", __LINE__);
  memset(raw, 0, 16);
  raw[0] = 100;
  memcpy(raw + 8, "{}      ", 8);
  expect_refused(raw, 16, "past the end", __LINE__);

  const char *T = "\"dtype\":\"F32\"";
  char h[1024];
  /* bad JSON */
  REFUSE_HDR("[]", 0, "does not start with '{'");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "bad JSON");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}x", 4, "trailing");
  REFUSE_HDR("{\"a\":1}", 0, "bad JSON");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, "bad JSON");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "unsigned");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "integer");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero");
  REFUSE_HDR("{\"a\\q\":{}}", 0, "bad escape");
  REFUSE_HDR("{\"a\xff\":{}}", 0, "UTF-8");
  REFUSE_HDR("{\"a\\u0000\":{}}", 0, "NUL");
  REFUSE_HDR("{\"a\\ud800\":{}}", 0, "surrogate");
  REFUSE_HDR("{\"a\x01\":{}}", 0, "control");
  REFUSE_HDR("{\"a", 0, "unterminated");
  REFUSE_HDR("{\"a\":{}}", 0, "empty tensor entry");
  /* fields */
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a': missing \"data_offsets\"");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
             "given twice");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
             "tensor 'a': unknown field 'x'");
  REFUSE_HDR("{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
             "tensor 'w': unknown dtype 'F7'");
  REFUSE_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
             "dimensions");
  REFUSE_HDR("{\"__metadata__\":{\"k\":1}}", 0, "bad JSON");
  REFUSE_HDR("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "key 'k' given twice");
  REFUSE_HDR("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ given twice");
  /* sizes and offsets */
  snprintf(h, sizeof h, "{\"big\":{%s,\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", T);
  REFUSE_HDR(h, 0, "tensor 'big': shape overflows");
  snprintf(h, sizeof h, "{\"big\":{%s,\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", T);
  REFUSE_HDR(h, 0, "tensor 'big': shape overflows");
  snprintf(h, sizeof h, "{\"big\":{%s,\"shape\":[9223372036854775808],\"data_offsets\":[0,0]}}", T);
  REFUSE_HDR(h, 0, "too large");
  snprintf(h, sizeof h, "{\"big\":{%s,\"shape\":[99999999999999999999],\"data_offsets\":[0,0]}}", T);
  REFUSE_HDR(h, 0, "64 bits");
  snprintf(h, sizeof h, "{\"m\":{%s,\"shape\":[2],\"data_offsets\":[0,4]}}", T);
  REFUSE_HDR(h, 8, "tensor 'm': data_offsets [0, 4] hold 4 bytes but shape x F32 needs 8");
  snprintf(h, sizeof h, "{\"r\":{%s,\"shape\":[1],\"data_offsets\":[8,4]}}", T);
  REFUSE_HDR(h, 8, "end before begin");
  snprintf(h, sizeof h, "{\"t\":{%s,\"shape\":[2],\"data_offsets\":[0,8]}}", T);
  REFUSE_HDR(h, 5, "tensor 't': data_offsets [0, 8] past the end of the data (5 bytes: truncated");
  snprintf(h, sizeof h,
           "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{%s,\"shape\":[1],"
           "\"data_offsets\":[2,6]}}",
           T, T);
  REFUSE_HDR(h, 6, "tensor 'b': data_offsets [2, 6] overlap 'a'");
  snprintf(h, sizeof h,
           "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{%s,\"shape\":[1],"
           "\"data_offsets\":[0,4]}}",
           T, T);
  REFUSE_HDR(h, 4, "overlap");
  snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[4,8]}}", T);
  REFUSE_HDR(h, 8, "tensor 'a': hole of 4 bytes");
  snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]}}", T);
  REFUSE_HDR(h, 6, "2 bytes after the last tensor");
  snprintf(h, sizeof h,
           "{\"dup\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"dup\":{%s,\"shape\":[1],"
           "\"data_offsets\":[4,8]}}",
           T, T);
  REFUSE_HDR(h, 8, "tensor 'dup' appears twice");
  /* a name given twice with the same (or overlapping) bytes: said so, not
   * that it overlaps itself */
  static const char *const dup_at[] = {"[0,4]", "[2,6]"};
  for (int i = 0; i < 2; i++) {
    snprintf(h, sizeof h,
             "{\"dup\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"dup\":{%s,\"shape\":[1],"
             "\"data_offsets\":%s}}",
             T, T, dup_at[i]);
    REFUSE_HDR(h, 4 + 2 * i, "tensor 'dup' appears twice");
  }
  /* the good version of the above loads */
  {
    size_t l;
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]}}  \n ", T);
    unsigned char *b = mk(h, 4, &l);
    ferry_safetensors *f;
    EXPECT_EQ_INT(ferry_safetensors_open_memory(b, l, &f), 0);
    ferry_safetensors_close(f);
    free(b);
  }

  /* a file truncated on disk: at open, and after open */
  const char *p = pth(g_tmp, "trunc.safetensors");
  EXPECT_EQ_INT(write_specs(p, 0, k_small, NSMALL, 100, 1), 0);
  ferry_safetensors *f;
  REQUIRE(ferry_safetensors_open(p, &f) == 0);
  struct stat st;
  stat(p, &st);
  REQUIRE(truncate(p, st.st_size - 3) == 0);
  ferry_safetensors_tensor t;
  size_t idx;
  ferry_safetensors_get(f, ferry_safetensors_count(f) - 1, &t);
  REQUIRE(ferry_safetensors_find(f, t.name, &t, &idx) == 0);
  unsigned char buf[64];
  EXPECT_EQ_INT(ferry_safetensors_read(f, idx, 0, buf, t.nbytes), FERRY_ECORRUPT);
  EXPECT(strstr(ferry_safetensors_last_error(f), t.name) != NULL);
  ferry_safetensors_close(f);
  EXPECT_EQ_INT(ferry_safetensors_open(p, &f), FERRY_ECORRUPT);
  EXPECT(strstr(ferry_last_error(), "truncated") != NULL);
  EXPECT_EQ_INT(ferry_safetensors_open(pth(g_tmp, "missing.safetensors"), &f), FERRY_ENOENT);

  /* terminal escapes in a tensor's and its file's names: a read's message
   * (a checkpoint load quotes it) shows them escaped, never raw */
  static const spec k_evil[] = {{"w\x1b]0;pwned\x07", FERRY_DT_F32, 1, {4}, 3}};
  const char *q = pth(g_tmp, "e\x1b]0;pwned\x07.safetensors");
  EXPECT_EQ_INT(write_specs(q, 0, k_evil, 1, 100, 0), 0);
  REQUIRE(ferry_safetensors_open(q, &f) == 0);
  stat(q, &st);
  REQUIRE(truncate(q, st.st_size - 3) == 0);
  EXPECT_EQ_INT(ferry_safetensors_read(f, 0, 0, buf, 16), FERRY_ECORRUPT);
  const char *msg = ferry_safetensors_last_error(f);
  EXPECT(!strchr(msg, '\x1b') && !strchr(msg, '\x07'));
  EXPECT(strstr(msg, "e\\x1b]0;pwned\\x07.safetensors: tensor 'w\\x1b]0;pwned\\x07'") != NULL);
  EXPECT_EQ_INT(ferry_safetensors_read(f, 0, 8, buf, 16), FERRY_EINVAL);
  msg = ferry_safetensors_last_error(f);
  EXPECT(!strchr(msg, '\x1b') && strstr(msg, "'w\\x1b]0;pwned\\x07': read of 16") != NULL);
  ferry_safetensors_close(f);
}

static void test_writer_errors(void) {
  ferry_safetensors_writer *w;
  const char *p = pth(g_tmp, "werr.safetensors");
  REQUIRE(ferry_safetensors_writer_create(p, 0, &w) == 0);
  int64_t s2[] = {2};
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "b", FERRY_DT_F32, 1, s2), 0);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "a", FERRY_DT_F32, 1, s2), 0);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "a", FERRY_DT_F32, 1, s2), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "__metadata__", FERRY_DT_F32, 1, s2), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "x", (ferry_dtype)99, 1, s2), FERRY_EINVAL);
  float v[3] = {1, 2, 3};
  EXPECT_EQ_INT(ferry_safetensors_writer_write(w, "b", v, 8), FERRY_ESTATE);
  EXPECT(strstr(ferry_safetensors_writer_last_error(w), "expected 'a'") != NULL);
  EXPECT_EQ_INT(ferry_safetensors_writer_write(w, "a", v, 12), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_safetensors_writer_write(w, "a", v, 8), 0);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "c", FERRY_DT_F32, 1, s2), FERRY_ESTATE);
  EXPECT_EQ_INT(ferry_safetensors_writer_finish(w), FERRY_ESTATE);
  EXPECT(strstr(ferry_safetensors_writer_last_error(w), "'b': 0 of 8") != NULL);
  /* destroyed unfinished: the partial file is removed */
  ferry_safetensors_writer_destroy(w);
  EXPECT(access(p, F_OK) != 0);
  EXPECT_EQ_INT(ferry_safetensors_writer_create("/proc/nonexistent/dir/x", 0, &w), 0);
  EXPECT_EQ_INT(ferry_safetensors_writer_add(w, "a", FERRY_DT_F32, 1, s2), 0);
  EXPECT(ferry_safetensors_writer_next(w) == NULL);
  EXPECT(ferry_safetensors_writer_finish(w) != 0);
  ferry_safetensors_writer_destroy(w);
  EXPECT(strcmp(ferry_dtype_name(FERRY_DT_BF16), "BF16") == 0);
  EXPECT(ferry_dtype_size(FERRY_DT_F64) == 8);
  EXPECT(ferry_dtype_name((ferry_dtype)-1) == NULL);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_safetensors FIXTURES_DIR SCRATCH_DIR\n");
    return 1;
  }
  g_fix = argv[1];
  g_tmp = argv[2];
  mkdir(g_tmp, 0777);
  test_hf_fixture();
  test_roundtrip();
  test_sharded();
  test_hostile();
  test_writer_errors();
  return test_finish("offload.safetensors");
}
