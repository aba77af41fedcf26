/* examples/gpt/tokenizer_hf.c — encoding and decoding with a Hugging Face
 * tokenizer.json (gpt_hf, read by tokenizer_json.c), as the `tokenizers`
 * library does it:
 *   added tokens split out first (leftmost, longest; lstrip, rstrip,
 *   single_word), then per piece the normalizers (Prepend, Replace, NFC),
 *   the pre-tokenizers (the GPT-2, Llama-3 and Qwen2 regex splits written
 *   out over code points and their Unicode classes, ByteLevel, Metaspace),
 *   and BPE: merges by rank (lowest first, then leftmost) from a heap, byte
 *   fallback to <0xNN>, unk; the post-processor's bos/eos around a text.
 *   Decoding runs the decoders over the list of tokens (ByteLevel, Replace,
 *   ByteFallback, Fuse, Strip, Metaspace).
 */
#include "tokenizer_json.h"
#include "unicode_data.h"

#include "core/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Unicode ------------------------------------------------------------------- */

enum { C_OTHER, C_LETTER, C_NUMBER, C_SPACE };

static int is_space(unsigned c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* Row of table (rows of {first, last, value}) holding c, or -1. */
static long find_range(const uint32_t (*t)[3], size_t n, unsigned c) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < t[mid][0]) hi = mid;
    else if (c > t[mid][1]) lo = mid + 1;
    else return (long)mid;
  }
  return -1;
}

/* gpt_uni_class's value of c: C_LETTER or C_NUMBER, + 4 for a word's. */
static int uvalue(unsigned c) {
  if (c < 128) {
    if ((c | 32) >= 'a' && (c | 32) <= 'z') return C_LETTER | 4;
    if (c >= '0' && c <= '9') return C_NUMBER | 4;
    return c == '_' ? 4 : 0;
  }
  long r = find_range(gpt_uni_class, gpt_uni_class_n, c);
  return r < 0 ? 0 : (int)gpt_uni_class[r][2];
}

static int uclass(unsigned c) { return is_space(c) ? C_SPACE : uvalue(c) & 3; }

/* The code point at s (n > 0 bytes left) and its length; a byte that is not
 * valid UTF-8 is one code point of its own, of no class (0x110000). */
static size_t get_cp(const char *s, size_t n, unsigned *cp) {
  size_t l = ferry_utf8_get((const unsigned char *)s, n, cp);
  if (!l) *cp = 0x110000, l = 1;
  return l;
}

static int class_at(const char *s, size_t n, size_t i, size_t *len) {
  unsigned cp;
  if (i >= n) return *len = 0, -1;
  *len = get_cp(s + i, n - i, &cp);
  return uclass(cp);
}

/* The end of the run of class k from i (at most max code points). */
static size_t run_of(const char *s, size_t n, size_t i, int k, int max) {
  size_t l;
  for (int c = 0; i < n && c < max && class_at(s, n, i, &l) == k; c++) i += l;
  return i;
}

/* ---- the regex splits -------------------------------------------------------------- */

static size_t contraction(const char *s, size_t n, int icase) {
  static const char *const con[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  if (n < 2 || s[0] != '\'') return 0;
  for (int k = 0; k < 7; k++) {
    size_t l = strlen(con[k]), j = 0;
    if (n < l + 1) continue;
    for (; j < l; j++)
      if ((icase ? (s[1 + j] | 32) : s[1 + j]) != con[k][j]) break;
    if (j == l) return l + 1;
  }
  return 0;
}

/* `\s+(?!\S)|\s+` from a white space at 0: the run, less its last code point
 * when something follows it and the run is longer than one. */
static size_t spaces(const char *s, size_t n) {
  size_t i = 0, last = 0, l;
  while (i < n && class_at(s, n, i, &l) == C_SPACE) last = i, i += l;
  return i < n && last > 0 ? last : i;
}

/* The length of the match at s[0..n) (n > 0) of the pattern `re` (HF_RE_*);
 * each pattern matches at every position, so its matches tile the text. */
static size_t re_match(int re, const char *s, size_t n) {
  size_t l0, l1, m;
  if ((m = contraction(s, n, re != HF_RE_GPT2))) return m;
  int c0 = class_at(s, n, 0, &l0), c1 = class_at(s, n, l0, &l1);
  if (re == HF_RE_GPT2) {
    /* ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+' then the spaces */
    if (s[0] == ' ' && c1 >= 0 && c1 != C_SPACE) return run_of(s, n, 1, c1, 1 << 30);
    if (c0 != C_SPACE) return run_of(s, n, 0, c0, 1 << 30);
    return spaces(s, n);
  }
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  if (c0 == C_LETTER) return run_of(s, n, 0, C_LETTER, 1 << 30);
  if (c0 != C_NUMBER && s[0] != '\r' && s[0] != '\n' && c1 == C_LETTER)
    return run_of(s, n, l0, C_LETTER, 1 << 30);
  /* \p{N}{1,3} (Qwen2: \p{N}) */
  if (c0 == C_NUMBER) return run_of(s, n, 0, C_NUMBER, re == HF_RE_LLAMA3 ? 3 : 1);
  /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
  size_t at = s[0] == ' ' && c1 == C_OTHER ? 1 : c0 == C_OTHER ? 0 : n;
  if (at < n) {
    m = run_of(s, n, at, C_OTHER, 1 << 30);
    while (m < n && (s[m] == '\r' || s[m] == '\n')) m++;
    return m;
  }
  /* \s*[\r\n]+ : to the last line break of the run of white space */
  size_t end = 0, i = 0, l;
  while (i < n && class_at(s, n, i, &l) == C_SPACE) {
    if (s[i] == '\r' || s[i] == '\n') end = i + 1;
    i += l;
  }
  return end ? end : spaces(s, n);
}

/* ---- NFC --------------------------------------------------------------------------- */

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_N = 19, V_N = 21,
       T_N = 28, S_N = 11172 };

static int ccc(unsigned c) {
  if (c < 0x300) return 0;
  long r = find_range(gpt_uni_ccc, gpt_uni_ccc_n, c);
  return r < 0 ? 0 : (int)gpt_uni_ccc[r][2];
}

static long decomp_row(unsigned c) {
  size_t lo = 0, hi = gpt_uni_decomp_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c == gpt_uni_decomp[mid][0]) return (long)mid;
    if (c < gpt_uni_decomp[mid][0]) hi = mid;
    else lo = mid + 1;
  }
  return -1;
}

typedef struct {
  unsigned *v;
  size_t n, cap;
} cps;

static int cps_push(cps *a, unsigned c) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    unsigned *p = realloc(a->v, cap * sizeof *p);
    if (!p) return -1;
    a->v = p, a->cap = cap;
  }
  a->v[a->n++] = c;
  return 0;
}

static int decompose(cps *a, unsigned c) {
  if (c >= S_BASE && c < S_BASE + S_N) {
    unsigned s = c - S_BASE, t = s % T_N;
    return cps_push(a, L_BASE + s / (V_N * T_N)) || cps_push(a, V_BASE + (s % (V_N * T_N)) / T_N) ||
           (t && cps_push(a, T_BASE + t));
  }
  long r = c >= 0xC0 && c < 0x110000 ? decomp_row(c) : -1;
  if (r < 0) return cps_push(a, c);
  unsigned second = gpt_uni_decomp[r][2] & 0x7FFFFFFFu;
  return decompose(a, gpt_uni_decomp[r][1]) || (second && decompose(a, second));
}

static unsigned compose(const gpt_hf *h, unsigned a, unsigned b) {
  if (a >= L_BASE && a < L_BASE + L_N && b >= V_BASE && b < V_BASE + V_N)
    return S_BASE + ((a - L_BASE) * V_N + (b - V_BASE)) * T_N;
  if (a >= S_BASE && a < S_BASE + S_N && (a - S_BASE) % T_N == 0 && b > T_BASE && b < T_BASE + T_N)
    return a + (b - T_BASE);
  uint64_t c;
  return gpt_umap_get(&h->nfc, (uint64_t)a << 32 | b, &c) ? (unsigned)c : 0;
}

static size_t put_utf8(char *o, unsigned c) {
  if (c < 0x80) return o[0] = (char)c, 1;
  if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 63)), 2;
  if (c < 0x10000)
    return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 63)), o[2] = (char)(0x80 | (c & 63)), 3;
  o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 63));
  o[2] = (char)(0x80 | (c >> 6 & 63)), o[3] = (char)(0x80 | (c & 63));
  return 4;
}

/* NFC of s[0..n) into a fresh *out: decompose, order the marks by class,
 * compose. Bytes that are not UTF-8 pass as they are (marked by bit 31). */
static int nfc(const gpt_hf *h, const char *s, size_t n, char **out, size_t *on) {
  cps d = {0};
  int rc = -1;
  for (size_t i = 0; i < n;) {
    unsigned c;
    size_t l = ferry_utf8_get((const unsigned char *)s + i, n - i, &c);
    if (l ? decompose(&d, c) : cps_push(&d, 0x80000000u | (unsigned char)s[i])) goto out;
    i += l ? l : 1;
  }
  for (size_t i = 1; i < d.n; i++) /* canonical order: a stable sort of each run of marks */
    for (size_t j = i; j > 0 && ccc(d.v[j]) && ccc(d.v[j - 1]) > ccc(d.v[j]); j--) {
      unsigned t = d.v[j];
      d.v[j] = d.v[j - 1], d.v[j - 1] = t;
    }
  size_t m = 0;
  long starter = -1;
  for (size_t i = 0; i < d.n; i++) {
    unsigned c = d.v[i], k;
    int cc = c >> 31 ? 0 : ccc(c);
    if (starter >= 0 && !(c >> 31)) {
      int last = (size_t)starter == m - 1 ? -1 : ccc(d.v[m - 1]);
      if ((last < 0 || (last && last < cc)) && (k = compose(h, d.v[starter], c))) {
        d.v[starter] = k;
        continue;
      }
    }
    if (!cc) starter = c >> 31 ? -1 : (long)m;
    d.v[m++] = c;
  }
  if (!(*out = malloc(m * 4 + 1))) goto out;
  *on = 0;
  for (size_t i = 0; i < m; i++)
    if (d.v[i] >> 31) (*out)[(*on)++] = (char)(d.v[i] & 255);
    else *on += put_utf8(*out + *on, d.v[i]);
  rc = 0;
out:
  free(d.v);
  return rc;
}

/* ---- BPE ------------------------------------------------------------------------- */

typedef struct {
  const gpt_hf *h;
  int32_t **ids;
  size_t *n, *cap;
  char *err;
  size_t el;
} enc;

static int push(enc *e, int32_t id) {
  if (*e->n == *e->cap) {
    size_t c = *e->cap ? *e->cap * 2 : 4096;
    int32_t *p = realloc(*e->ids, c * sizeof *p);
    if (!p) return snprintf(e->err, e->el, "out of memory"), -1;
    *e->ids = p, *e->cap = c;
  }
  (*e->ids)[(*e->n)++] = id;
  return 0;
}

typedef struct {
  int32_t id;
  int prev, next;
} sym;

typedef struct {
  uint32_t rank;
  int pos;
  int32_t l, r, merged;
} cand;

static int cand_less(const cand *a, const cand *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(cand *hp, size_t *n, cand c) {
  size_t i = (*n)++;
  for (; i && cand_less(&c, &hp[(i - 1) / 2]); i = (i - 1) / 2) hp[i] = hp[(i - 1) / 2];
  hp[i] = c;
}

static cand heap_pop(cand *hp, size_t *n) {
  cand top = hp[0], last = hp[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && cand_less(&hp[c + 1], &hp[c])) c++;
    if (!cand_less(&hp[c], &last)) break;
    hp[i] = hp[c], i = c;
  }
  if (*n) hp[i] = last;
  return top;
}

static void try_pair(const gpt_hf *h, const sym *s, int i, cand *hp, size_t *nh) {
  uint64_t v;
  if (i < 0 || s[i].next < 0) return;
  int32_t a = s[i].id, b = s[s[i].next].id;
  if (gpt_umap_get(&h->merges, (uint64_t)a << 32 | (uint64_t)b, &v))
    heap_push(hp, nh, (cand){(uint32_t)(v >> 32), i, a, b, (int32_t)(v & 0xFFFFFFFFu)});
}

#define META "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static int bpe_word(enc *e, const char *w, size_t n);

/* One word (a pre-token) through the model. Where no token holds a
 * character then U+2581 (h->meta_cut: SentencePiece's vocabularies), no
 * merge crosses such a place: the word is cut there, so a text with no
 * pre-tokenizer (Llama-2's) is not one word as long as the text. */
static int bpe(enc *e, const char *w, size_t n) {
  size_t a = 0;
  for (size_t i = 1; e->h->meta_cut && i + 3 <= n; i++)
    if (!memcmp(w + i, META, 3) && (i < 3 || memcmp(w + i - 3, META, 3))) {
      if (bpe_word(e, w + a, i - a)) return -1;
      a = i;
    }
  return bpe_word(e, w + a, n - a);
}

/* The <0xNN> ids of the bytes of w[0..l) into s, when each byte has one:
 * how many (0 when one lacks). */
static size_t byte_syms(const gpt_hf *h, const char *w, size_t l, sym *s) {
  for (size_t j = 0; j < l; j++)
    if (h->byte_id[(unsigned char)w[j]] < 0) return 0;
  for (size_t j = 0; j < l; j++) s[j].id = h->byte_id[(unsigned char)w[j]];
  return l;
}

/* One word: its characters (or their bytes, or unk), then the merges,
 * lowest rank first and leftmost among equals. */
static int bpe_word(enc *e, const char *w, size_t n) {
  const gpt_hf *h = e->h;
  int id;
  if (!n) return 0;
  if (h->ignore_merges && (id = gpt_smap_get(&h->vocab, w, n)) >= 0) return push(e, id);
  sym *s = malloc(n * sizeof *s);
  cand *hp = malloc((3 * n + 1) * sizeof *hp); /* ns - 1 pairs, then 2 a merge */
  size_t ns = 0, nh = 0;
  int rc = -1, last_unk = 0;
  if (!s || !hp) {
    snprintf(e->err, e->el, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n;) {
    unsigned cp;
    size_t l = get_cp(w + i, n - i, &cp), k = 0;
    if ((id = gpt_smap_get(&h->vocab, w + i, l)) >= 0) {
      s[ns++].id = id, last_unk = 0;
    } else if (h->byte_fallback && (k = byte_syms(h, w + i, l, s + ns))) {
      ns += k, last_unk = 0;
    } else {
      if (h->unk < 0) {
        snprintf(e->err, e->el, "no token for the character '%.*s' and no unk token", (int)l, w + i);
        goto out;
      }
      if (!(h->fuse_unk && last_unk)) s[ns++].id = h->unk;
      last_unk = 1;
    }
    i += l;
  }
  for (size_t i = 0; i < ns; i++) s[i].prev = (int)i - 1, s[i].next = i + 1 < ns ? (int)i + 1 : -1;
  for (size_t i = 0; i + 1 < ns; i++) try_pair(h, s, (int)i, hp, &nh);
  while (nh) {
    cand c = heap_pop(hp, &nh);
    int r = s[c.pos].next;
    if (s[c.pos].id != c.l || r < 0 || s[r].id != c.r) continue; /* stale */
    s[c.pos].id = c.merged;
    s[r].id = -2;
    s[c.pos].next = s[r].next;
    if (s[r].next >= 0) s[s[r].next].prev = c.pos;
    try_pair(h, s, s[c.pos].prev, hp, &nh);
    try_pair(h, s, c.pos, hp, &nh);
  }
  rc = 0;
  for (int i = ns ? 0 : -1; i >= 0 && !rc; i = s[i].next) rc = push(e, s[i].id);
out:
  free(s), free(hp);
  return rc;
}

/* ---- normalizers and pre-tokenizers --------------------------------------------------- */

/* s[0..n) with every `a` replaced by `b`, and `pre` put before it. */
static char *replace(const char *s, size_t n, const char *a, const char *b, const char *pre, size_t *on) {
  size_t al = strlen(a), bl = strlen(b), pl = strlen(pre), k = 0;
  for (size_t i = 0; al && i + al <= n; i++)
    if (!memcmp(s + i, a, al)) k++, i += al - 1;
  char *o = malloc(pl + n + k * bl + 1), *p = o;
  if (!o) return NULL;
  memcpy(p, pre, pl), p += pl;
  for (size_t i = 0; i < n;) {
    if (al && i + al <= n && !memcmp(s + i, a, al)) memcpy(p, b, bl), p += bl, i += al;
    else *p++ = s[i++];
  }
  *p = 0;
  *on = (size_t)(p - o);
  return o;
}

static int pre(enc *e, int step, const char *s, size_t n, int at_start);

/* Each match of regex re in s[0..n), through the next pre-tokenizer. */
static int split_re(enc *e, int step, int re, const char *s, size_t n, int at_start) {
  for (size_t i = 0, m; i < n; i += m, at_start = 0)
    if (pre(e, step, s + i, m = re_match(re, s + i, n - i), at_start)) return -1;
  return 0;
}

/* The bytes of s[0..n) as GPT-2's code points, through pre-tokenizer `step`. */
static int byte_piece(enc *e, int step, const char *s, size_t n, int at_start) {
  char *m = malloc(2 * n + 1);
  size_t k = 0;
  if (!m) return -1;
  for (size_t i = 0; i < n; i++)
    for (const char *b = e->h->byte_str[(unsigned char)s[i]]; *b; b++) m[k++] = *b;
  int rc = pre(e, step, m, k, at_start);
  free(m);
  return rc;
}

/* Each piece of s through the pre-tokenizer `step` and those after it, then BPE. */
static int pre(enc *e, int step, const char *s, size_t n, int at_start) {
  const gpt_hf *h = e->h;
  if (!n) return 0;
  if (step == h->n_pre) return bpe(e, s, n);
  const gpt_hf_step *st = &h->pre[step];
  int rc = -1;
  size_t on, rl = st->a ? strlen(st->a) : 0;
  char *o = NULL;
  switch (st->type) {
  case HF_PRE_SPLIT: return split_re(e, step + 1, st->x, s, n, at_start);
  case HF_PRE_BYTELEVEL:
    if (st->x && s[0] != ' ') {
      if (!(o = replace(s, n, "", "", " ", &on))) break;
      s = o, n = on;
    }
    rc = 0;
    for (size_t i = 0, m; i < n && !rc; i += m) {
      m = st->y ? re_match(HF_RE_GPT2, s + i, n - i) : n - i;
      rc = byte_piece(e, step + 1, s + i, m, at_start && i == 0);
    }
    break;
  case HF_PRE_METASPACE: {
    int lead = (st->x == HF_SCHEME_ALWAYS || (st->x == HF_SCHEME_FIRST && at_start)) && s[0] != ' ' &&
               (n < rl || memcmp(s, st->a, rl));
    if (!(o = replace(s, n, " ", st->a, lead ? st->a : "", &on))) break;
    rc = 0;
    for (size_t i = 0, j; i < on && !rc; i = j) { /* split: each replacement starts a piece */
      for (j = i + 1; st->y && j < on && (j + rl > on || memcmp(o + j, st->a, rl)); j++) {
      }
      if (!st->y) j = on;
      rc = pre(e, step + 1, o + i, j - i, at_start && i == 0);
    }
    break;
  }
  }
  free(o);
  if (rc && !e->err[0]) snprintf(e->err, e->el, "out of memory");
  return rc;
}

/* s[0..n) through the normalizers into *out (NULL when none applied: s as
 * it is); -1 when out of memory. */
static int normalize(const gpt_hf *h, const char *s, size_t n, char **out, size_t *on) {
  char *cur = NULL, *nx = NULL;
  size_t nn = 0;
  *out = NULL, *on = n;
  for (int i = 0; i < h->n_norm && n; i++) {
    const gpt_hf_step *st = &h->norm[i];
    if (st->type == HF_NORM_PREPEND) nx = replace(s, n, "", "", st->a, &nn);
    else if (st->type == HF_NORM_REPLACE) nx = replace(s, n, st->a, st->b, "", &nn);
    else {
      size_t k = 0;
      while (k < n && (unsigned char)s[k] < 0xCC) k++; /* below U+0300 nothing composes */
      if (k == n) continue;
      if (nfc(h, s, n, &nx, &nn)) nx = NULL;
    }
    free(cur);
    if (!(cur = nx)) return -1;
    s = cur, n = nn;
  }
  *out = cur, *on = n;
  return 0;
}

int gpt_hf_prepare(gpt_hf *h) {
  h->meta_cut = 1;
  for (size_t i = 0; i < h->vocab.cap && h->meta_cut; i++) {
    const char *k = h->vocab.keys[i], *m;
    for (size_t at = 1; k && (m = strstr(k + at, META)); at = (size_t)(m - k) + 1)
      if (m - k < 3 || memcmp(m - 3, META, 3)) {
        h->meta_cut = 0;
        break;
      }
  }
  for (int i = 0; i < h->n_added; i++) {
    gpt_hf_added *a = &h->added[i];
    if (!a->normalized) {
      h->added_first[(unsigned char)a->s[0]] |= 1;
      continue;
    }
    if (normalize(h, a->s, a->len, &a->ns, &a->nlen)) return -1;
    if (!a->ns && !(a->ns = strdup(a->s))) return -1;
    if (a->nlen) h->added_first[(unsigned char)a->ns[0]] |= 2;
    h->id_str[a->id] = a->ns; /* decoded as the normalizers write it, as `tokenizers` does */
  }
  return 0;
}

/* Whether the code point at i (back: the one ending at i, none before
 * from) is a word's (\w). */
static int word_char(const char *s, size_t n, size_t from, size_t i, int back) {
  unsigned cp;
  if (back) {
    if (i <= from) return 0;
    for (i--; i > from && ((unsigned char)s[i] & 0xC0) == 0x80; i--) {
    }
  }
  return i < n && get_cp(s + i, n - i, &cp) && (uvalue(cp) & 4);
}

/* The first added token in s[from..n) (longest where several start at one
 * place): its index and its span, white space taken in by lstrip / rstrip;
 * -1 when none. norm 0: the tokens matched in the text as it is; 1: those
 * matched after the normalizers, by their normalized content. */
static int next_added(const gpt_hf *h, int norm, const char *s, size_t n, size_t from, size_t *ms,
                      size_t *me) {
  for (size_t p = from; p < n; p++) {
    if (!(h->added_first[(unsigned char)s[p]] & (1 << norm))) continue;
    int best = -1;
    size_t bl = 0;
    for (int k = 0; k < h->n_added; k++) {
      const gpt_hf_added *a = &h->added[k];
      const char *c = norm ? a->ns : a->s;
      size_t cl = norm ? a->nlen : a->len;
      if (a->normalized != norm || cl <= bl || p + cl > n || memcmp(s + p, c, cl)) continue;
      if (a->single_word && (word_char(s, n, 0, p, 1) || word_char(s, n, 0, p + cl, 0))) continue;
      best = k, bl = cl;
    }
    if (best < 0) continue;
    size_t b = p, en = p + bl, l;
    while (h->added[best].lstrip && b > from) {
      size_t q = b - 1;
      while (q > from && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
      if (class_at(s, n, q, &l) != C_SPACE) break;
      b = q;
    }
    while (h->added[best].rstrip && en < n && class_at(s, n, en, &l) == C_SPACE) en += l;
    *ms = b, *me = en;
    return best;
  }
  return -1;
}

/* One piece between the added tokens matched in the text: the normalizers,
 * the added tokens matched after them, the pre-tokenizers of each piece. */
static int piece(enc *e, const char *s, size_t n, int at_start) {
  const gpt_hf *h = e->h;
  char *cur;
  if (normalize(h, s, n, &cur, &n)) return snprintf(e->err, e->el, "out of memory"), -1;
  if (cur) s = cur;
  int rc = 0;
  for (size_t from = 0; !rc;) {
    size_t ms = n, me = n;
    int k = next_added(h, 1, s, n, from, &ms, &me);
    rc = pre(e, 0, s + from, ms - from, at_start && from == 0);
    if (rc || k < 0) break;
    rc = push(e, h->added[k].id);
    from = me;
  }
  free(cur);
  return rc;
}

int gpt_hf_encode(const gpt_hf *h, const char *text, size_t len, int special, int32_t **ids,
                  size_t *n, size_t *cap, char *err, size_t el) {
  enc e = {h, ids, n, cap, err, el};
  err[0] = 0;
  for (int i = 0; special && i < h->n_bos; i++)
    if (push(&e, h->bos[i])) return -1;
  for (size_t from = 0;;) {
    size_t ms = len, me = len;
    int k = next_added(h, 0, text, len, from, &ms, &me);
    if (piece(&e, text + from, ms - from, from == 0) || (k >= 0 && push(&e, h->added[k].id))) return -1;
    if (k < 0) break;
    from = me;
  }
  for (int i = 0; special && i < h->n_eos; i++)
    if (push(&e, h->eos[i])) return -1;
  return 0;
}

/* ---- decoding ------------------------------------------------------------------------ */

typedef struct {
  char **s;
  size_t *l, n;
} toks;

static void toks_free(toks *t) {
  for (size_t i = 0; i < t->n; i++) free(t->s[i]);
  free(t->s), free(t->l);
  t->s = NULL, t->l = NULL, t->n = 0;
}

/* Appends a copy of s[0..n) to t (which has room: every step keeps or lowers the count). */
static int toks_add(toks *t, const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (!c) return -1;
  memcpy(c, s, n), c[n] = 0;
  t->s[t->n] = c, t->l[t->n++] = n;
  return 0;
}

static int toks_init(toks *t, size_t n) {
  t->n = 0, t->s = malloc((n + 1) * sizeof *t->s), t->l = malloc((n + 1) * sizeof *t->l);
  return t->s && t->l ? 0 : -1;
}

/* All of t as one token, with sep between. */
static int join(toks *t, const char *sep) {
  size_t total = 0, sl = strlen(sep), k = 0;
  for (size_t i = 0; i < t->n; i++) total += t->l[i] + sl;
  char *o = malloc(total + 1);
  if (!o) return -1;
  for (size_t i = 0; i < t->n; i++) {
    if (i) memcpy(o + k, sep, sl), k += sl;
    memcpy(o + k, t->s[i], t->l[i]), k += t->l[i];
  }
  o[k] = 0;
  toks_free(t);
  if (toks_init(t, 1)) return free(o), -1;
  t->s[0] = o, t->l[0] = k, t->n = 1;
  return 0;
}

/* <0xNN> as its byte, else -1. */
static int byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
  unsigned v;
  char hex[3] = {s[3], s[4], 0}, *end;
  v = (unsigned)strtoul(hex, &end, 16);
  return *end || !((s[3] >= '0' && s[3] <= '9') || ((s[3] | 32) >= 'a' && (s[3] | 32) <= 'f')) ? -1 : (int)v;
}

static int flush_bytes(toks *o, const char *b, size_t nb, int stream) {
  if (!nb) return 0;
  size_t i = 0, l;
  unsigned cp;
  while (i < nb && (l = ferry_utf8_get((const unsigned char *)b + i, nb - i, &cp))) i += l;
  if (i == nb || stream) return toks_add(o, b, nb);
  char *rep = malloc(3 * nb);
  if (!rep) return -1;
  for (size_t k = 0; k < nb; k++) memcpy(rep + 3 * k, "\xef\xbf\xbd", 3); /* U+FFFD a byte */
  int rc = toks_add(o, rep, 3 * nb);
  free(rep);
  return rc;
}

/* The length of the longest start of a UTF-8 sequence at s (n > 0 bytes
 * left, not valid there): what one U+FFFD replaces, as Rust's
 * from_utf8_lossy does. */
static size_t bad_run(const unsigned char *s, size_t n) {
  unsigned b = s[0], lo = 0x80, hi = 0xBF;
  size_t need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 1;
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  size_t k = 1;
  for (; k < need && k < n && s[k] >= (k == 1 ? lo : 0x80) && s[k] <= (k == 1 ? hi : 0xBF); k++) {
  }
  return k;
}

/* The one token of t with each run that is not UTF-8 as U+FFFD. */
static int lossy(toks *t) {
  const unsigned char *s = (const unsigned char *)t->s[0];
  size_t n = t->l[0], k = 0, l;
  unsigned cp;
  char *o = malloc(3 * n + 1);
  if (!o) return -1;
  for (size_t i = 0; i < n; i += l)
    if ((l = ferry_utf8_get(s + i, n - i, &cp))) memcpy(o + k, s + i, l), k += l;
    else l = bad_run(s + i, n - i), memcpy(o + k, "\xef\xbf\xbd", 3), k += 3;
  o[k] = 0;
  free(t->s[0]);
  t->s[0] = o, t->l[0] = k;
  return 0;
}

/* One decoder over the tokens; see the file's comment. */
static int dec_step(const gpt_hf *h, const gpt_hf_step *st, toks *t, int stream) {
  toks o;
  char bytes[1024];
  size_t nb = 0, al = st->a ? strlen(st->a) : 0, on = 0;
  int rc = 0;
  if (st->type == HF_DEC_FUSE) return join(t, "");
  if (toks_init(&o, t->n)) return -1;
  for (size_t i = 0; i < t->n && !rc; i++) {
    const char *s = t->s[i];
    size_t n = t->l[i], a = 0, b = n, l;
    char *r = NULL;
    unsigned cp;
    int v;
    switch (st->type) {
    case HF_DEC_BYTELEVEL: /* a token's code points as bytes, when all are GPT-2's */
      if (!(r = malloc(n + 1))) {
        rc = -1;
        break;
      }
      on = 0;
      while (a < n && (l = get_cp(s + a, n - a, &cp)) && cp < 512 && h->unbyte[cp] >= 0)
        r[on++] = (char)h->unbyte[cp], a += l;
      rc = a == n ? toks_add(&o, r, on) : toks_add(&o, s, n);
      break;
    case HF_DEC_REPLACE:
    case HF_DEC_METASPACE:
      r = replace(s, n, st->a, st->type == HF_DEC_REPLACE ? st->b : i == 0 && st->x != HF_SCHEME_NEVER && !stream ? "" : " ", "", &on);
      rc = r ? toks_add(&o, r, on) : -1;
      break;
    case HF_DEC_BYTEFALLBACK:
      if ((v = byte_token(s, n)) >= 0) {
        if (nb == sizeof bytes && flush_bytes(&o, bytes, nb, stream)) rc = -1;
        nb = nb == sizeof bytes ? 0 : nb;
        bytes[nb++] = (char)v;
        break;
      }
      rc = flush_bytes(&o, bytes, nb, stream) || toks_add(&o, s, n);
      nb = 0;
      break;
    case HF_DEC_STRIP:
      for (int k = 0; !stream && k < st->x && b - a >= al && al && !memcmp(s + a, st->a, al); k++) a += al;
      for (int k = 0; !stream && k < st->y && b - a >= al && al && !memcmp(s + b - al, st->a, al); k++) b -= al;
      rc = toks_add(&o, s + a, b - a);
      break;
    }
    free(r);
  }
  if (!rc && st->type == HF_DEC_BYTEFALLBACK) rc = flush_bytes(&o, bytes, nb, stream);
  if (!rc && st->type == HF_DEC_BYTELEVEL) rc = join(&o, "") || (!stream && lossy(&o));
  toks_free(t);
  *t = o;
  return rc;
}

int gpt_hf_decode(const gpt_hf *h, const int32_t *ids, size_t n, int skip_special, int stream,
                  char **out, size_t *len) {
  toks t;
  int rc = toks_init(&t, n);
  for (size_t i = 0; i < n && !rc; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= h->n_ids || !h->id_str[id] || (skip_special && h->is_special[id])) continue;
    rc = toks_add(&t, h->id_str[id], strlen(h->id_str[id]));
  }
  for (int i = 0; i < h->n_dec && !rc; i++) rc = dec_step(h, &h->dec[i], &t, stream);
  if (!rc) rc = join(&t, h->has_decoder ? "" : " ");
  if (!rc) *out = t.s[0], *len = t.l[0], t.s[0] = NULL;
  toks_free(&t);
  return rc;
}
