/* examples/gpt/tokenizer.c — the tokenizers of ferry-gpt behind one type:
 * byte-level (one id per byte), GPT-2's byte-level BPE from vocab.json +
 * merges.txt (bytes mapped to printable code points, the pre-tokenizer's
 * classes of contractions, letters, digits, other and spaces, then merges by
 * rank), and a Hugging Face tokenizer.json (tokenizer_json.c, tokenizer_hf.c);
 * which one a --tokenizer path names.
 */
#include "gpt.h"

#include "core/file.h"
#include "core/json.h"
#include "core/untrusted.h"
#include "tok_map.h"
#include "tokenizer_json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the tokenizer ----------------------------------------------------------- */

struct gpt_tokenizer {
  gpt_hf *hf; /* a tokenizer.json; the fields below unused */
  int bpe;
  int vocab;
  gpt_smap tok;    /* mapped string -> id */
  gpt_smap merges; /* "a b" -> rank */
  char **id_str; /* id -> mapped string */
  char byte_str[256][4]; /* byte -> its mapped code point in UTF-8 */
  int unbyte[512];       /* mapped code point -> byte */
};

int gpt_tokenizer_bytes(gpt_tokenizer **out) {
  gpt_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return -1;
  t->vocab = 256;
  *out = t;
  return 0;
}

void gpt_tokenizer_free(gpt_tokenizer *t) {
  if (!t) return;
  gpt_hf_free(t->hf);
  gpt_smap_free(&t->tok);
  gpt_smap_free(&t->merges);
  if (t->id_str)
    for (int i = 0; i < t->vocab; i++) free(t->id_str[i]);
  free(t->id_str);
  free(t);
}

int gpt_tokenizer_vocab(const gpt_tokenizer *t) { return t->vocab; }

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 take code points 256, 257, ... in byte order. */
void gpt_byte_map(char byte_str[256][4], int unbyte[512]) {
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unsigned cp = keep ? (unsigned)b : 256u + (unsigned)extra++;
    char *o = byte_str[b];
    if (cp < 0x80) {
      o[0] = (char)cp, o[1] = 0;
    } else {
      o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
    }
    unbyte[cp] = b;
  }
}

int gpt_tokenizer_bpe(const char *vocab_json, const char *merges_txt, gpt_tokenizer **out,
                      char *err, size_t el) {
  gpt_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return -1;
  t->bpe = 1;
  gpt_byte_map(t->byte_str, t->unbyte);
  size_t len;
  char *text = NULL;
  if (ferry_read_below(NULL, vocab_json, FERRY_MAX_TOKENIZER, &text, &len, err, el)) goto fail;
  ferry_json_cur j;
  ferry_json_iter it;
  ferry_json_init(&j, text, len);
  char key[1024];
  int max_id = -1, more;
  if (ferry_json_enter(&j, '{', &it)) goto bad_json;
  while ((more = ferry_json_more(&j, &it)) == 1) {
    double v;
    if (ferry_json_string(&j, key, sizeof key, NULL) || ferry_json_expect(&j, ':') ||
        ferry_json_number(&j, &v, NULL, NULL) || v < 0 || v > 10000000)
      goto bad_json;
    if (gpt_smap_put(&t->tok, key, (int)v)) goto oom;
    if ((int)v > max_id) max_id = (int)v;
  }
  if (more < 0) goto bad_json;
  free(text);
  text = NULL;
  t->vocab = max_id + 1;
  t->id_str = calloc((size_t)t->vocab + 1, sizeof *t->id_str);
  if (!t->id_str) goto oom;
  for (size_t i = 0; i < t->tok.cap; i++)
    if (t->tok.keys[i] && !t->id_str[t->tok.vals[i]])
      if (!(t->id_str[t->tok.vals[i]] = strdup(t->tok.keys[i]))) goto oom;
  if (ferry_read_below(NULL, merges_txt, FERRY_MAX_TOKENIZER, &text, &len, err, el)) goto fail;
  int rank = 0;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    size_t n = strlen(line);
    if (n && line[n - 1] == '\r') line[--n] = 0;
    if (!n || (rank == 0 && !strncmp(line, "#version", 8))) continue;
    char *sp = strchr(line, ' ');
    if (!sp || strchr(sp + 1, ' ')) {
      snprintf(err, el, "%s: line '%.60s' is not two symbols", merges_txt, line);
      goto fail;
    }
    if (gpt_smap_get(&t->merges, line, n) < 0 && gpt_smap_put(&t->merges, line, rank)) goto oom;
    rank++;
  }
  free(text);
  *out = t;
  return 0;
bad_json:
  snprintf(err, el, "%s: not a JSON object of token -> id", vocab_json);
  goto fail;
oom:
  snprintf(err, el, "out of memory");
fail:
  free(text);
  gpt_tokenizer_free(t);
  return -1;
}

static int push(int32_t **ids, size_t *n, size_t *cap, int32_t v) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 4096;
    int32_t *p = realloc(*ids, c * sizeof *p);
    if (!p) return -1;
    *ids = p, *cap = c;
  }
  (*ids)[(*n)++] = v;
  return 0;
}

/* character classes of the GPT-2 pre-tokenizer, bytes >= 0x80 as letters */
static int is_sp(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_let(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z' ? 1 : c >= 0x80; }
static int is_dig(unsigned char c) { return c >= '0' && c <= '9'; }

/* The length of the pre-token starting at s[0..n). */
static size_t pretoken(const unsigned char *s, size_t n) {
  if (s[0] == '\'' && n > 1) {
    static const char *con[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (int i = 0; i < 7; i++) {
      size_t l = strlen(con[i]);
      if (n >= l && !memcmp(s, con[i], l)) return l;
    }
  }
  size_t i = 0;
  if (!is_sp(s[0]) || (s[0] == ' ' && n > 1 && !is_sp(s[1]))) {
    if (s[0] == ' ') i = 1;
    unsigned char c = s[i];
    int cls = is_let(c) ? 1 : is_dig(c) ? 2 : 3;
    while (i < n) {
      c = s[i];
      int k = is_sp(c) ? 0 : is_let(c) ? 1 : is_dig(c) ? 2 : 3;
      if (k != cls) break;
      i++;
    }
    return i;
  }
  /* spaces: a run, less the last one when a non-space follows it */
  while (i < n && is_sp(s[i])) i++;
  if (i < n && i > 1) i--;
  return i;
}

typedef struct {
  char *s;
} sym;

static int bpe_word(const gpt_tokenizer *t, const unsigned char *w, size_t n, int32_t **ids,
                    size_t *cnt, size_t *cap) {
  /* symbols as mapped strings, merged in place by lowest rank */
  size_t ns = n;
  char **s = malloc(n * sizeof *s);
  if (!s) return -1;
  for (size_t i = 0; i < n; i++) s[i] = strdup(t->byte_str[w[i]]);
  char buf[2048];
  for (;;) {
    int best = -1;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
      int l = snprintf(buf, sizeof buf, "%s %s", s[i], s[i + 1]);
      if (l < 0 || (size_t)l >= sizeof buf) continue;
      int r = gpt_smap_get(&t->merges, buf, (size_t)l);
      if (r >= 0 && (best < 0 || r < best)) best = r, bi = i;
    }
    if (best < 0) break;
    size_t a = strlen(s[bi]), b = strlen(s[bi + 1]);
    char *m = malloc(a + b + 1);
    if (!m) break;
    memcpy(m, s[bi], a);
    memcpy(m + a, s[bi + 1], b + 1);
    free(s[bi]), free(s[bi + 1]);
    s[bi] = m;
    memmove(s + bi + 1, s + bi + 2, (ns - bi - 2) * sizeof *s);
    ns--;
  }
  int rc = 0;
  for (size_t i = 0; i < ns; i++) {
    int id = gpt_smap_get(&t->tok, s[i], strlen(s[i]));
    if (id < 0) rc = -1; /* a symbol the vocabulary lacks */
    else if (push(ids, cnt, cap, id)) rc = -1;
    free(s[i]);
  }
  free(s);
  return rc;
}

int gpt_tokenizer_encode(const gpt_tokenizer *t, const char *text, size_t len, int32_t **ids,
                         size_t *n, size_t *cap) {
  const unsigned char *s = (const unsigned char *)text;
  char err[256];
  if (t->hf) return gpt_hf_encode(t->hf, text, len, 0, ids, n, cap, err, sizeof err);
  if (!t->bpe) {
    for (size_t i = 0; i < len; i++)
      if (push(ids, n, cap, s[i])) return -1;
    return 0;
  }
  for (size_t i = 0; i < len;) {
    size_t l = pretoken(s + i, len - i);
    if (!l) l = 1;
    if (bpe_word(t, s + i, l, ids, n, cap)) return -1;
    i += l;
  }
  return 0;
}

size_t gpt_tokenizer_decode(const gpt_tokenizer *t, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= t->vocab) return 0;
  if (t->hf) {
    char *s;
    size_t l;
    if (gpt_hf_decode(t->hf, &id, 1, 0, 1, &s, &l)) return 0;
    l = l < cap ? l : cap;
    memcpy(buf, s, l);
    free(s);
    return l;
  }
  if (!t->bpe) {
    if (cap < 1) return 0;
    buf[0] = (char)id;
    return 1;
  }
  const unsigned char *p = (const unsigned char *)t->id_str[id];
  size_t n = 0;
  if (!p) return 0;
  while (*p && n < cap) {
    unsigned cp;
    if (*p < 0x80) cp = *p++;
    else if ((*p & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) cp = (unsigned)(*p & 0x1F) << 6 | (p[1] & 0x3F), p += 2;
    else return n; /* not a byte symbol */
    if (cp >= 512) return n;
    buf[n++] = (char)t->unbyte[cp];
  }
  return n;
}

int gpt_tokenizer_json(const char *path, gpt_tokenizer **out, char *err, size_t el) {
  gpt_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return snprintf(err, el, "out of memory"), -1;
  if (gpt_hf_load(path, &t->hf, err, el)) {
    free(t);
    return -1;
  }
  t->vocab = t->hf->n_ids;
  *out = t;
  return 0;
}

/* The bos / eos a token field of tokenizer_config.json names (a string or
 * {"content": ...}) into ids[0..*n): one when add, none otherwise. */
static int config_special(const gpt_tokenizer *t, const ferry_json_value *cfg, const char *key,
                          const char *fallback, int add, int32_t *ids, int *n, char *err,
                          size_t el) {
  *n = 0;
  if (!add) return 0;
  const ferry_json_value *v = ferry_json_get(cfg, key);
  if (v && v->type == FERRY_JSON_OBJ) v = ferry_json_get(v, "content");
  const char *name = v && v->type == FERRY_JSON_STR ? v->str : fallback;
  int id = gpt_tokenizer_id(t, name);
  if (id < 0)
    return snprintf(err, el, "add_%s is on but its token '%.100s' is not in the vocabulary", key,
                    name), -1;
  ids[(*n)++] = id;
  return 0;
}

/* transformers' Llama-style fast tokenizers (the tokenizer_class of a
 * tokenizer_config.json beside the tokenizer.json) replace the file's
 * post-processor by bos when add_bos_token (default on) and eos when
 * add_eos_token (default off): so does this, where that file says so. */
static int apply_tokenizer_config(gpt_tokenizer *t, const char *folder, char *err, size_t el) {
  static const char *const cls[][3] = {{"LlamaTokenizer", "<s>", "</s>"},
                                       {"CodeLlamaTokenizer", "<s>", "</s>"},
                                       {"GemmaTokenizer", "<bos>", "<eos>"}};
  char path[4200], *text;
  size_t len;
  struct stat st;
  snprintf(path, sizeof path, "%.4000s/tokenizer_config.json", folder);
  if (stat(path, &st)) return 0;
  if (ferry_read_below(folder, "tokenizer_config.json", FERRY_MAX_TOKENIZER, &text, &len, err, el))
    return -1;
  ferry_json_value *cfg = NULL;
  char why[256];
  int rc = ferry_json_parse(text, len, &cfg, why, sizeof why);
  free(text);
  if (rc || cfg->type != FERRY_JSON_OBJ) {
    snprintf(err, el, "%.3800s: %s", path, rc ? why : "not a JSON object");
    ferry_json_free(cfg);
    return -1;
  }
  const ferry_json_value *c = ferry_json_get(cfg, "tokenizer_class");
  int k = -1;
  for (int i = 0; c && c->type == FERRY_JSON_STR && i < 3; i++) {
    size_t n = strlen(cls[i][0]);
    if (!strncmp(c->str, cls[i][0], n) && (!c->str[n] || !strcmp(c->str + n, "Fast"))) k = i;
  }
  if (k >= 0) {
    const ferry_json_value *b = ferry_json_get(cfg, "add_bos_token"),
                           *e = ferry_json_get(cfg, "add_eos_token");
    int add_bos = b && b->type == FERRY_JSON_BOOL ? b->b : 1;
    int add_eos = e && e->type == FERRY_JSON_BOOL ? e->b : 0;
    rc = config_special(t, cfg, "bos_token", cls[k][1], add_bos, t->hf->bos, &t->hf->n_bos, err,
                        el) ||
         config_special(t, cfg, "eos_token", cls[k][2], add_eos, t->hf->eos, &t->hf->n_eos, err,
                        el);
  }
  ferry_json_free(cfg);
  if (rc) {
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, el, "%.3800s: %s", path, why);
  }
  return rc ? -1 : 0;
}

/* A tokenizer.json, then the tokenizer_config.json in its folder. */
static int load_json_in(const char *file, gpt_tokenizer **out, char *err, size_t el) {
  if (gpt_tokenizer_json(file, out, err, el)) return -1;
  const char *slash = strrchr(file, '/');
  char folder[4096];
  snprintf(folder, sizeof folder, "%.*s", slash ? (int)(slash - file) : 1, slash ? file : ".");
  if (!folder[0]) snprintf(folder, sizeof folder, "/");
  if (!apply_tokenizer_config(*out, folder, err, el)) return 0;
  gpt_tokenizer_free(*out);
  *out = NULL;
  return -1;
}

int gpt_tokenizer_load(const char *path, gpt_tokenizer **out, char *err, size_t el) {
  char a[4096], b[4096];
  struct stat st;
  if (stat(path, &st)) return snprintf(err, el, "%s: %s", path, strerror(errno)), -1;
  if (!S_ISDIR(st.st_mode)) return load_json_in(path, out, err, el);
  snprintf(a, sizeof a, "%.4000s/tokenizer.json", path);
  if (!stat(a, &st)) return load_json_in(a, out, err, el);
  snprintf(a, sizeof a, "%.4000s/vocab.json", path);
  snprintf(b, sizeof b, "%.4000s/merges.txt", path);
  return gpt_tokenizer_bpe(a, b, out, err, el);
}

int gpt_tokenizer_encode_text(const gpt_tokenizer *t, const char *text, size_t len, int special,
                              int32_t **ids, size_t *n, size_t *cap, char *err, size_t el) {
  if (t->hf) return gpt_hf_encode(t->hf, text, len, special, ids, n, cap, err, el);
  if (!gpt_tokenizer_encode(t, text, len, ids, n, cap)) return 0;
  snprintf(err, el, "a symbol the vocabulary lacks, or out of memory");
  return -1;
}

int gpt_tokenizer_decode_text(const gpt_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *len) {
  if (t->hf) return gpt_hf_decode(t->hf, ids, n, skip_special, 0, out, len);
  size_t cap = 64, k = 0;
  char *o = malloc(cap);
  for (size_t i = 0; o && i < n; i++) {
    char b[1024];
    size_t l = gpt_tokenizer_decode(t, ids[i], b, sizeof b);
    if (k + l + 1 > cap) {
      char *p = realloc(o, cap = 2 * (k + l + 1));
      if (!p) free(o);
      o = p;
    }
    if (o) memcpy(o + k, b, l), k += l;
  }
  if (!o) return -1;
  o[k] = 0;
  *out = o, *len = k;
  return 0;
}

int gpt_tokenizer_id(const gpt_tokenizer *t, const char *token) {
  if (t->hf) {
    for (int i = 0; i < t->hf->n_added; i++)
      if (!strcmp(t->hf->added[i].s, token)) return t->hf->added[i].id;
    return gpt_smap_get(&t->hf->vocab, token, strlen(token));
  }
  return t->bpe ? gpt_smap_get(&t->tok, token, strlen(token)) : -1;
}
