/* tests/gpt/test_tokenizer.c — the byte-level tokenizer, GPT-2 BPE with a
 * vocabulary and merges this test writes itself (every byte symbol plus a
 * few merges, so the expected ids are known), and the data loader (text and
 * uint16/uint32 token files, seeded batches). argv[1]: scratch directory.
 */
#include "gpt.h"

#include "tests/test.h"

#include <string.h>
#include <sys/stat.h>

static const char *g_tmp;

static char *tmp(const char *name) {
  static char b[4][1024];
  static int k;
  char *p = b[k++ % 4];
  if (snprintf(p, 1024, "%s/%s", g_tmp, name) >= 1024) abort();
  return p;
}

/* GPT-2's byte -> code point map (printable Latin-1 kept, others 256+). */
static unsigned byte_cp(int b) {
  int extra = 0;
  for (int i = 0; i < 256; i++) {
    int keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
    if (i == b) return keep ? (unsigned)i : 256u + (unsigned)extra;
    if (!keep) extra++;
  }
  return 0;
}

static void put_cp(FILE *f, unsigned cp) {
  if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (char)cp);
  else if (cp < 0x80) fputc((int)cp, f);
  else fprintf(f, "\\u%04x", cp); /* exercise the \u escapes of the reader */
}

static void put_utf8(FILE *f, unsigned cp) {
  if (cp < 0x80) fputc((int)cp, f);
  else fputc((int)(0xC0 | (cp >> 6)), f), fputc((int)(0x80 | (cp & 0x3F)), f);
}

static void decode_all(const gpt_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
  size_t at = 0;
  for (size_t i = 0; i < n; i++) at += gpt_tokenizer_decode(t, ids[i], out + at, cap - 1 - at);
  out[at] = 0;
}

static void test_bytes(void) {
  gpt_tokenizer *t;
  REQUIRE(gpt_tokenizer_bytes(&t) == 0);
  EXPECT_EQ_INT(gpt_tokenizer_vocab(t), 256);
  const char *s = "h\xc3\xa9llo\n\x01";
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  REQUIRE(gpt_tokenizer_encode(t, s, strlen(s), &ids, &n, &cap) == 0);
  EXPECT_EQ_INT(n, strlen(s));
  EXPECT_EQ_INT(ids[1], 0xc3);
  char out[64];
  decode_all(t, ids, n, out, sizeof out);
  EXPECT(strcmp(out, s) == 0);
  free(ids);
  gpt_tokenizer_free(t);
}

static void test_bpe(void) {
  /* ids 0..255: the byte symbols in byte order; then the merges' results */
  const char *merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xc4\xa0", "w"},
                             {"o", "r"}, {"\xc4\xa0w", "or"}, {"\xc4\xa0", "hello"}};
  const int nm = 8;
  FILE *v = fopen(tmp("vocab.json"), "w"), *mf = fopen(tmp("merges.txt"), "w");
  REQUIRE(v && mf);
  fprintf(v, "{");
  for (int b = 0; b < 256; b++) {
    fprintf(v, "%s\"", b ? ", " : "");
    put_cp(v, byte_cp(b));
    fprintf(v, "\": %d", b);
  }
  fprintf(mf, "#version: 0.2\n");
  for (int i = 0; i < nm; i++) {
    fprintf(v, ", \"%s%s\": %d", merges[i][0], merges[i][1], 256 + i);
    fprintf(mf, "%s %s\n", merges[i][0], merges[i][1]);
  }
  fprintf(v, "}\n");
  fclose(v);
  fclose(mf);
  (void)put_utf8;
  gpt_tokenizer *t;
  char err[256];
  if (gpt_tokenizer_bpe(tmp("vocab.json"), tmp("merges.txt"), &t, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  EXPECT_EQ_INT(gpt_tokenizer_vocab(t), 256 + nm);
  const char *s = "hello world hello";
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  REQUIRE(gpt_tokenizer_encode(t, s, strlen(s), &ids, &n, &cap) == 0);
  /* "hello" | " world" -> Ġwor l d | " hello" -> Ġhello */
  int32_t want[] = {259, 262, 'l', 'd', 263};
  EXPECT_EQ_INT(n, 5);
  for (size_t i = 0; i < n && i < 5; i++) EXPECT_EQ_INT(ids[i], want[i]);
  char out[256];
  decode_all(t, ids, n, out, sizeof out);
  EXPECT(strcmp(out, s) == 0);
  /* anything round-trips: every byte has a symbol */
  const char *odd = "it's  3 cats\n\n\tcaf\xc3\xa9 \"q\" \\ \x7f\x01 end ";
  n = 0;
  REQUIRE(gpt_tokenizer_encode(t, odd, strlen(odd), &ids, &n, &cap) == 0);
  decode_all(t, ids, n, out, sizeof out);
  EXPECT(strcmp(out, odd) == 0);
  /* the pre-tokenizer keeps "'s" whole and a space with the next word */
  n = 0;
  REQUIRE(gpt_tokenizer_encode(t, "'s he", 5, &ids, &n, &cap) == 0);
  EXPECT_EQ_INT(n, 4); /* ' s Ġ he */
  if (n == 4) EXPECT_EQ_INT(ids[3], 256);
  free(ids);
  gpt_tokenizer_free(t);
  /* a bad merges file */
  FILE *b = fopen(tmp("bad_merges.txt"), "w");
  fprintf(b, "a b c\n");
  fclose(b);
  EXPECT(gpt_tokenizer_bpe(tmp("vocab.json"), tmp("bad_merges.txt"), &t, err, sizeof err) != 0);
  EXPECT(strstr(err, "two symbols") != NULL);
}

static void test_data(void) {
  gpt_tokenizer *t;
  REQUIRE(gpt_tokenizer_bytes(&t) == 0);
  char err[256];
  FILE *f = fopen(tmp("text.txt"), "w");
  for (int i = 0; i < 100; i++) fprintf(f, "line %d of the text\n", i);
  fclose(f);
  gpt_data d, d2;
  REQUIRE(gpt_data_load(&d, tmp("text.txt"), t, 256, 7, err, sizeof err) == 0);
  REQUIRE(gpt_data_load(&d2, tmp("text.txt"), t, 256, 7, err, sizeof err) == 0);
  int32_t a[4 * 8], at[4 * 8], b[4 * 8], bt[4 * 8];
  for (int k = 0; k < 3; k++) {
    REQUIRE(gpt_data_batch(&d, 4, 8, a, at) == 0);
    REQUIRE(gpt_data_batch(&d2, 4, 8, b, bt) == 0);
    EXPECT(memcmp(a, b, sizeof a) == 0 && memcmp(at, bt, sizeof at) == 0);
    for (int r = 0; r < 4; r++)
      for (int i = 0; i + 1 < 8; i++) EXPECT_EQ_INT(at[r * 8 + i], a[r * 8 + i + 1]);
  }
  gpt_data_free(&d2);
  REQUIRE(gpt_data_load(&d2, tmp("text.txt"), t, 256, 8, err, sizeof err) == 0);
  REQUIRE(gpt_data_batch(&d2, 4, 8, b, bt) == 0);
  REQUIRE(gpt_data_batch(&d, 4, 8, a, at) == 0);
  EXPECT(memcmp(a, b, sizeof a) != 0);
  gpt_data_free(&d);
  gpt_data_free(&d2);
  /* token files */
  uint16_t u16[64];
  uint32_t u32[64];
  for (int i = 0; i < 64; i++) u16[i] = (uint16_t)(i * 3), u32[i] = (uint32_t)(i * 1000);
  f = fopen(tmp("tok.u16"), "wb");
  fwrite(u16, 2, 64, f);
  fclose(f);
  f = fopen(tmp("tok.u32"), "wb");
  fwrite(u32, 4, 64, f);
  fclose(f);
  REQUIRE(gpt_data_load(&d, tmp("tok.u16"), t, 256, 1, err, sizeof err) == 0);
  EXPECT_EQ_INT(d.n, 64);
  EXPECT_EQ_INT(d.tokens[10], 30);
  gpt_data_free(&d);
  EXPECT(gpt_data_load(&d, tmp("tok.u32"), t, 256, 1, err, sizeof err) != 0);
  EXPECT(strstr(err, "outside the model's vocabulary") != NULL);
  REQUIRE(gpt_data_load(&d, tmp("tok.u32"), t, 64000, 1, err, sizeof err) == 0);
  EXPECT_EQ_INT(d.tokens[63], 63000);
  EXPECT(gpt_data_batch(&d, 1, 64, a, at) != 0); /* needs seq + 1 tokens */
  gpt_data_free(&d);
  gpt_tokenizer_free(t);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt_tokenizer SCRATCH\n");
    return 1;
  }
  g_tmp = argv[1];
  mkdir(g_tmp, 0777);
  test_bytes();
  test_bpe();
  test_data();
  return test_finish("gpt.tokenizer");
}
