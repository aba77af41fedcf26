/* tests/gpt/test_tokenizer_json.c — Hugging Face tokenizer.json against the
 * ids of the `tokenizers` library: every fixture of tests/fixtures/tokenizers
 * (byte-level and SentencePiece-style BPE, made by gen_tokenizers.py there)
 * encodes each text of its cases.json to the committed ids, with and without
 * the special tokens around a text, and decodes them to the committed text
 * (the text itself wherever `tokenizers` gives it back). Files it cannot
 * follow are refused naming why. Then a generated
 * tokenizer.json over 10 MB, Llama-3's size, loads in a few seconds.
 * argv[1]: the fixtures folder; argv[2]: a scratch folder.
 */
#include "gpt.h"

#include "core/file.h"
#include "core/json.h"
#include "tests/test.h"

#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int same_ids(const int32_t *ids, size_t n, const ferry_json_value *want) {
  if (!want || want->type != FERRY_JSON_ARR || want->n != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (want->items[i].i != ids[i]) return 0;
  return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
  fprintf(stderr, "  %s:", what);
  for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

/* One fixture: every case's ids, and its decoded text equal to the text
 * wherever `tokenizers` gives the text back. */
static void fixture(const char *root, const char *name) {
  char dir[1024], path[1100], err[512], why[256];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  gpt_tokenizer *t;
  if (gpt_tokenizer_load(dir, &t, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    test_failures++;
    return;
  }
  snprintf(path, sizeof path, "%s/cases.json", dir);
  char *text;
  size_t len;
  ferry_json_value *cases;
  REQUIRE(ferry_read_file(path, 1 << 24, &text, &len, why, sizeof why) == 0);
  REQUIRE(ferry_json_parse(text, len, &cases, why, sizeof why) == 0);
  REQUIRE(cases->type == FERRY_JSON_ARR && cases->n >= 20);
  int trips = 0, hf_trips = 0;
  for (size_t c = 0; c < cases->n; c++) {
    const ferry_json_value *k = &cases->items[c];
    const char *s = ferry_json_get(k, "text")->str, *want = ferry_json_get(k, "decoded")->str;
    for (int special = 0; special < 2; special++) {
      int32_t *ids = NULL;
      size_t n = 0, cap = 0;
      if (gpt_tokenizer_encode_text(t, s, strlen(s), special, &ids, &n, &cap, err, sizeof err)) {
        fprintf(stderr, "%s: case %zu: %s\n", name, c, err);
        test_failures++;
        continue;
      }
      const ferry_json_value *w = ferry_json_get(k, special ? "ids_special" : "ids");
      if (!same_ids(ids, n, w)) {
        fprintf(stderr, "%s: case %zu (special %d) '%s': ids differ\n", name, c, special, s);
        print_ids("ferry", ids, n);
        fprintf(stderr, "  want %zu ids\n", w ? w->n : 0);
        test_failures++;
      }
      if (!special) {
        char *back;
        size_t bl;
        REQUIRE(gpt_tokenizer_decode_text(t, ids, n, 0, &back, &bl) == 0);
        if (strcmp(back, want)) {
          fprintf(stderr, "%s: case %zu: decoded '%s', want '%s'\n", name, c, back, want);
          test_failures++;
        }
        trips += !strcmp(back, s), hf_trips += !strcmp(want, s);
        free(back);
      }
      free(ids);
    }
  }
  printf("%s: %zu cases, %d round-trip (tokenizers: %d)\n", name, cases->n, trips, hf_trips);
  EXPECT_EQ_INT(trips, hf_trips);
  /* the others are the files' own: Metaspace's first space cut, NFC, lstrip;
   * add_prefix_space puts a space before each text that decoding keeps */
  EXPECT((size_t)hf_trips + 4 >= cases->n || !strcmp(name, "gpt2_prefix"));
  ferry_json_free(cases);
  free(text);
  gpt_tokenizer_free(t);
}

/* Ids that cut a character: one U+FFFD for each run that is not UTF-8 (the
 * texts `tokenizers` 0.23 decodes), the bytes as they are when streamed. */
static void partial(const char *root) {
  static const struct {
    const char *fix;
    int32_t ids[4];
    size_t n;
    const char *want;
  } k[] = {
      {"gpt2", {173, 254}, 2, "\xef\xbf\xbd"},            /* F0 9F of U+1F600 */
      {"gpt2", {254, 247, 223, 65}, 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "a"},
      {"gpt2", {173, 247}, 2, "\xef\xbf\xbd"},            /* F0 98: a start, cut */
      {"sp_legacy", {353, 243}, 2, "\xef\xbf\xbd"},       /* "\u2581" <0xF0> */
  };
  char dir[1024], err[512];
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    gpt_tokenizer *t;
    snprintf(dir, sizeof dir, "%s/%s", root, k[i].fix);
    REQUIRE(gpt_tokenizer_load(dir, &t, err, sizeof err) == 0);
    char *out, b[64];
    size_t len, at = 0;
    REQUIRE(gpt_tokenizer_decode_text(t, k[i].ids, k[i].n, 0, &out, &len) == 0);
    if (strcmp(out, k[i].want)) {
      fprintf(stderr, "partial %zu: '%s'\n", i, out);
      test_failures++;
    }
    free(out);
    for (size_t j = 0; j < k[i].n; j++) at += gpt_tokenizer_decode(t, k[i].ids[j], b + at, sizeof b - at);
    if (i == 0) EXPECT(at == 2 && (unsigned char)b[0] == 0xF0 && (unsigned char)b[1] == 0x9F);
    gpt_tokenizer_free(t);
  }
}

/* A tokenizer.json this reader cannot follow is refused, naming why. */
static void refused(const char *scratch) {
  static const char *const bad[][2] = {
      {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model type 'WordPiece'"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
       "merge 'ab' has a token the vocabulary lacks"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, "
       "\"behavior\": \"Isolated\"}, \"model\": {\"vocab\": {}, \"merges\": []}}",
       "regex"},
      {"{\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"vocab\": {}, \"merges\": []}}",
       "normalizer 'NFKC'"},
      {"{\"model\": {\"vocab\": {\"a\": 99999999}, \"merges\": []}}", "model.vocab"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [", "line 1"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}", "dropout"},
  };
  char path[1024], err[512];
  snprintf(path, sizeof path, "%s/bad.json", scratch);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(bad[i][0], f) >= 0 && fclose(f) == 0);
    gpt_tokenizer *t = NULL;
    err[0] = 0;
    EXPECT(gpt_tokenizer_load(path, &t, err, sizeof err) == -1);
    if (!strstr(err, bad[i][1])) {
      fprintf(stderr, "bad %zu: '%s' does not name '%s'\n", i, err, bad[i][1]);
      test_failures++;
    }
    gpt_tokenizer_free(t);
  }
  remove(path);
}

/* GPT-2's byte -> code point, as UTF-8. */
static void byte_utf8(int b, char *o) {
  int extra = 0;
  unsigned cp = 0;
  for (int i = 0; i <= b; i++) {
    int keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
    cp = keep ? (unsigned)i : 256u + (unsigned)extra++;
  }
  if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
  else o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
}

/* s as a JSON string's content (GPT-2's byte symbols hold '"' and '\\'). */
static void put_str(FILE *f, const char *s) {
  for (; *s; s++) fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
}

/* A byte-level tokenizer.json of 128k tokens and 280k merges, laid out as
 * Llama-3's file is (one merge a line), loaded and used. */
static void big_file(const char *scratch) {
  enum { NTOK = 128000, NMERGE = 280000 };
  char path[1024];
  snprintf(path, sizeof path, "%s/big.json", scratch);
  char **tok = calloc(NTOK, sizeof *tok);
  REQUIRE(tok);
  FILE *f = fopen(path, "w");
  REQUIRE(f);
  fprintf(f, "{\n  \"version\": \"1.0\",\n  \"added_tokens\": [],\n  \"normalizer\": null,\n"
             "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
             "  \"decoder\": {\"type\": \"ByteLevel\"},\n  \"model\": {\n    \"type\": \"BPE\",\n"
             "    \"vocab\": {\n");
  unsigned long long seed = 7;
  int n = 0, m = 0;
  /* merges first in memory: token n = tok[a] + tok[b] */
  int (*mg)[2] = calloc(NMERGE, sizeof *mg);
  REQUIRE(mg);
  for (; n < 256; n++) { /* the 256 bytes, in byte order */
    tok[n] = malloc(4);
    byte_utf8(n, tok[n]);
  }
  while (n < NTOK) {
    int a = (int)(test_rand(&seed) % (unsigned long long)(n < 4000 ? n : 4000));
    int b = (int)(test_rand(&seed) % (unsigned long long)n);
    size_t la = strlen(tok[a]), lb = strlen(tok[b]);
    if (la + lb > 24) continue;
    char *s = malloc(la + lb + 1);
    memcpy(s, tok[a], la), memcpy(s + la, tok[b], lb + 1);
    int dup = 0;
    for (int k = n - 1; k >= 0 && k > n - 64; k--) dup |= !strcmp(tok[k], s);
    if (dup) {
      free(s);
      continue;
    }
    tok[n] = s, mg[m][0] = a, mg[m][1] = b, n++, m++;
  }
  for (int i = 0; i < n; i++) {
    fprintf(f, "      \"");
    put_str(f, tok[i]);
    fprintf(f, "\": %d,\n", i);
  }
  fprintf(f, "      \"<end>\": %d\n    },\n    \"merges\": [\n", n);
  /* later merges repeat earlier pairs (kept at their first rank, as HF does) */
  for (int i = 0; i < NMERGE; i++) {
    int k = i < m ? i : (int)(test_rand(&seed) % (unsigned long long)m);
    fprintf(f, "      \"");
    put_str(f, tok[mg[k][0]]);
    fputc(' ', f);
    put_str(f, tok[mg[k][1]]);
    fprintf(f, "\"%s\n", i + 1 < NMERGE ? "," : "");
  }
  fprintf(f, "    ]\n  }\n}\n");
  REQUIRE(fclose(f) == 0);
  struct stat st;
  REQUIRE(stat(path, &st) == 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  gpt_tokenizer *t;
  char err[512];
  int rc = gpt_tokenizer_load(path, &t, err, sizeof err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (rc) fprintf(stderr, "big: %s\n", err);
  REQUIRE(rc == 0);
  printf("big: %.1f MB, %d tokens, %d merges: loaded in %.2f s\n", (double)st.st_size / 1e6, n + 1,
         NMERGE, s);
  EXPECT(st.st_size > 10000000);
  EXPECT(s < 30); /* a few seconds on a busy 2-core machine; sanitizers included */
  EXPECT_EQ_INT(gpt_tokenizer_vocab(t), n + 1);
  const char *text = "The quick brown fox jumps over the lazy dog, 12345 times.";
  int32_t *ids = NULL;
  size_t ni = 0, cap = 0;
  char *back;
  size_t bl;
  REQUIRE(gpt_tokenizer_encode_text(t, text, strlen(text), 1, &ids, &ni, &cap, err, sizeof err) == 0);
  REQUIRE(gpt_tokenizer_decode_text(t, ids, ni, 0, &back, &bl) == 0);
  EXPECT(strcmp(back, text) == 0);
  EXPECT(ni > 0 && ni <= strlen(text) + 1);
  free(back), free(ids);
  gpt_tokenizer_free(t);
  for (int i = 0; i < n; i++) free(tok[i]);
  free(tok), free(mg);
  remove(path);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 3);
  mkdir(argv[2], 0777);
  static const char *const names[] = {"gpt2",         "gpt2_prefix", "llama3",  "qwen2",
                                      "sp_legacy",    "sp_metaspace", "sp_split"};
  for (int i = 0; i < 7; i++) fixture(argv[1], names[i]);
  partial(argv[1]);
  refused(argv[2]);
  big_file(argv[2]);
  return test_finish("gpt.tokenizer_json");
}
