/* core/json.c — the one JSON reader of core/json.h: the bounded cursor
 * (white space, brackets and members, strings with their escapes and UTF-8
 * checks, numbers, literals, skipping) and the small tree built on it.
 */
#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cursor ---------------------------------------------------------- */

void ferry_json_init(ferry_json_cur *c, const char *text, size_t len) {
  memset(c, 0, sizeof *c);
  c->p = c->begin = text;
  c->end = text + len;
}

int ferry_json_fail(ferry_json_cur *c, const char *fmt, ...) {
  if (c->err_at) return -1;
  c->err_at = c->p;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  return -1;
}

void ferry_json_line_col(const ferry_json_cur *c, const char *at, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (const char *q = c->begin; q < at && q < c->end; q++) {
    if (*q == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

int ferry_json_peek(ferry_json_cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
  return c->p < c->end ? (unsigned char)*c->p : -1;
}

int ferry_json_eat(ferry_json_cur *c, char ch) {
  if (ferry_json_peek(c) != (unsigned char)ch) return 0;
  c->p++;
  return 1;
}

int ferry_json_expect(ferry_json_cur *c, char ch) {
  return ferry_json_eat(c, ch) ? 0 : ferry_json_fail(c, "expected '%c'", ch);
}

int ferry_json_at_end(ferry_json_cur *c) { return ferry_json_peek(c) < 0; }

/* The error for a byte no value starts with. */
static int fail_char(ferry_json_cur *c) {
  int ch = ferry_json_peek(c);
  if (ch < 0) return ferry_json_fail(c, "unexpected end of input");
  if (ch == '\'') return ferry_json_fail(c, "strings take double quotes");
  if (ch == '/') return ferry_json_fail(c, "comments are not JSON");
  if (ch < 0x20 || ch > 0x7e) return ferry_json_fail(c, "unexpected byte 0x%02x", (unsigned)ch);
  return ferry_json_fail(c, "unexpected character '%c'", ch);
}

int ferry_json_kind(ferry_json_cur *c) {
  int ch = ferry_json_peek(c);
  switch (ch) {
  case '"': return FERRY_JSON_STR;
  case '{': return FERRY_JSON_OBJ;
  case '[': return FERRY_JSON_ARR;
  case 't':
  case 'f': return FERRY_JSON_BOOL;
  case 'n': return FERRY_JSON_NULL;
  default: break;
  }
  if (ch == '-' || (ch >= '0' && ch <= '9')) return FERRY_JSON_NUM;
  return fail_char(c);
}

int ferry_json_enter(ferry_json_cur *c, char open, ferry_json_iter *it) {
  if (ferry_json_peek(c) != (unsigned char)open) return ferry_json_fail(c, "expected '%c'", open);
  if (c->depth >= FERRY_JSON_MAX_DEPTH)
    return ferry_json_fail(c, "nesting deeper than %d", FERRY_JSON_MAX_DEPTH);
  c->depth++;
  c->p++;
  it->close = open == '{' ? '}' : ']';
  it->n = 0;
  return 0;
}

int ferry_json_more(ferry_json_cur *c, ferry_json_iter *it) {
  int obj = it->close == '}';
  int ch = ferry_json_peek(c);
  if (ch == (unsigned char)it->close) {
    c->p++;
    c->depth--;
    return 0;
  }
  if (it->n) {
    if (ch != ',') return ferry_json_fail(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    c->p++;
    if (ferry_json_peek(c) == (unsigned char)it->close)
      return ferry_json_fail(c, obj ? "trailing comma in object" : "trailing comma in array");
  }
  if (obj && ferry_json_peek(c) != '"') return ferry_json_fail(c, "expected a quoted key");
  it->n++;
  return 1;
}

/* ---- strings --------------------------------------------------------------- */

size_t ferry_utf8_get(const unsigned char *s, size_t n, unsigned *cp) {
  if (n == 0) return 0;
  unsigned c = s[0], min;
  size_t len;
  if (c < 0x80)
    len = 1, min = 0;
  else if ((c & 0xE0) == 0xC0)
    len = 2, min = 0x80, c &= 0x1F;
  else if ((c & 0xF0) == 0xE0)
    len = 3, min = 0x800, c &= 0x0F;
  else if ((c & 0xF8) == 0xF0)
    len = 4, min = 0x10000, c &= 0x07;
  else
    return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    c = (c << 6) | (s[i] & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  if (cp) *cp = c;
  return len;
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

static int hex4(ferry_json_cur *c, unsigned *out) {
  if (c->end - c->p < 4) return ferry_json_fail(c, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char h = *c->p++;
    v <<= 4;
    if (h >= '0' && h <= '9')
      v |= (unsigned)(h - '0');
    else if (h >= 'a' && h <= 'f')
      v |= (unsigned)(h - 'a' + 10);
    else if (h >= 'A' && h <= 'F')
      v |= (unsigned)(h - 'A' + 10);
    else
      return ferry_json_fail(c, "bad hex digit in \\u escape");
  }
  *out = v;
  return 0;
}

/* A \u escape (after its "\u"), with the low half of a surrogate pair. */
static int unicode_escape(ferry_json_cur *c, unsigned *out) {
  unsigned cp, lo;
  if (hex4(c, &cp)) return -1;
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u')
      return ferry_json_fail(c, "high surrogate without its low surrogate");
    c->p += 2;
    if (hex4(c, &lo)) return -1;
    if (lo < 0xDC00 || lo > 0xDFFF) return ferry_json_fail(c, "invalid low surrogate");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
  } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
    return ferry_json_fail(c, "lone low surrogate");
  }
  if (cp == 0) return ferry_json_fail(c, "\\u0000 (NUL) is not supported in strings");
  *out = cp;
  return 0;
}

/* One escape (after its backslash) decoded into o; its length or -1. */
static int escape(ferry_json_cur *c, char o[4]) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  static const char from_shown[] = "\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX";
  if (c->p >= c->end) return ferry_json_fail(c, "unterminated string");
  char e = *c->p++;
  if (e == 'u') {
    unsigned cp = 0;
    return unicode_escape(c, &cp) ? -1 : (int)utf8_put(o, cp);
  }
  const char *k = e ? strchr(from, e) : NULL;
  if (k) {
    o[0] = to[k - from];
    return 1;
  }
  if (e > 0x20 && e < 0x7f)
    return ferry_json_fail(c, "invalid escape '\\%c' (a bad escape: JSON has %s)", e, from_shown);
  return ferry_json_fail(c, "invalid escape: byte 0x%02x after '\\' (a bad escape: JSON has %s)",
                         (unsigned char)e, from_shown);
}

/* Appends k bytes to a bounded buffer: what does not fit is counted only. */
static void put(char *buf, size_t cap, size_t *n, const char *s, size_t k) {
  for (size_t i = 0; i < k; i++, (*n)++)
    if (*n + 1 < cap) buf[*n] = s[i];
}

int ferry_json_string(ferry_json_cur *c, char *buf, size_t cap, size_t *len) {
  if (ferry_json_peek(c) != '"') return ferry_json_fail(c, "expected a string");
  c->p++;
  size_t n = 0;
  for (;;) {
    if (c->p >= c->end) return ferry_json_fail(c, "unterminated string");
    unsigned char ch = (unsigned char)*c->p;
    if (ch == '"') break;
    if (ch < 0x20) return ferry_json_fail(c, "control character in string (escape it)");
    if (ch == '\\') {
      char o[4];
      c->p++;
      int k = escape(c, o);
      if (k < 0) return -1;
      put(buf, cap, &n, o, (size_t)k);
      continue;
    }
    size_t k = ferry_utf8_get((const unsigned char *)c->p, (size_t)(c->end - c->p), NULL);
    if (!k) return ferry_json_fail(c, "invalid UTF-8 in string");
    put(buf, cap, &n, c->p, k);
    c->p += k;
  }
  c->p++;
  if (cap) buf[n < cap ? n : cap - 1] = '\0';
  if (len) *len = n;
  return 0;
}

int ferry_json_strdup(ferry_json_cur *c, char **out, size_t *len) {
  size_t n;
  ferry_json_peek(c);
  const char *at = c->p;
  if (ferry_json_string(c, NULL, 0, &n)) return -1;
  char *s = malloc(n + 1);
  if (!s) return ferry_json_fail(c, "out of memory");
  c->p = at; /* checked: the second pass only copies */
  ferry_json_string(c, s, n + 1, NULL);
  *out = s;
  if (len) *len = n;
  return 0;
}

/* ---- numbers and literals ------------------------------------------------- */

static int digit(const ferry_json_cur *c, const char *q) {
  return q < c->end && *q >= '0' && *q <= '9';
}

/* The end of the number at the cursor (RFC 8259's grammar), or NULL with an
 * error; *integral when it has neither fraction nor exponent. */
static const char *number_end(ferry_json_cur *c, int *integral) {
  const char *q = c->p;
  *integral = 1;
  if (q < c->end && *q == '-') q++;
  if (!digit(c, q)) return ferry_json_fail(c, "invalid number"), NULL;
  if (*q == '0') {
    if (digit(c, ++q)) return ferry_json_fail(c, "leading zero in number"), NULL;
  } else {
    while (digit(c, q))
      q++;
  }
  if (q < c->end && *q == '.') {
    *integral = 0;
    if (!digit(c, ++q)) return ferry_json_fail(c, "digit expected after '.'"), NULL;
    while (digit(c, q))
      q++;
  }
  if (q < c->end && (*q == 'e' || *q == 'E')) {
    *integral = 0;
    q++;
    if (q < c->end && (*q == '+' || *q == '-')) q++;
    if (!digit(c, q)) return ferry_json_fail(c, "digit expected in exponent"), NULL;
    while (digit(c, q))
      q++;
  }
  return q;
}

int ferry_json_number(ferry_json_cur *c, double *num, int *is_int, int64_t *i) {
  int integral;
  ferry_json_peek(c);
  const char *q = number_end(c, &integral);
  if (!q) return -1;
  char buf[64];
  size_t n = (size_t)(q - c->p);
  if (n >= sizeof buf) return ferry_json_fail(c, "number too long");
  memcpy(buf, c->p, n);
  buf[n] = '\0';
  double v = strtod(buf, NULL);
  if (!isfinite(v)) return ferry_json_fail(c, "number out of range");
  int whole = 0;
  long long x = 0;
  if (integral) {
    errno = 0;
    x = strtoll(buf, NULL, 10);
    whole = !errno;
  }
  if (num) *num = v;
  if (is_int) *is_int = whole;
  if (i) *i = whole ? x : 0;
  c->p = q;
  return 0;
}

int ferry_json_u64(ferry_json_cur *c, uint64_t *out) {
  int integral;
  ferry_json_peek(c);
  if (!digit(c, c->p)) return ferry_json_fail(c, "expected an unsigned integer");
  const char *q = number_end(c, &integral);
  if (!q) return -1;
  if (!integral) return ferry_json_fail(c, "expected an integer");
  uint64_t v = 0;
  for (; c->p < q; c->p++) {
    unsigned d = (unsigned)(*c->p - '0');
    if (v > (UINT64_MAX - d) / 10) return ferry_json_fail(c, "integer does not fit in 64 bits");
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* 1 when the word comes next (consumed). */
static int word(ferry_json_cur *c, const char *w) {
  size_t n = strlen(w);
  ferry_json_peek(c);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return 0;
  c->p += n;
  return 1;
}

int ferry_json_bool(ferry_json_cur *c, int *out) {
  if (word(c, "true"))
    *out = 1;
  else if (word(c, "false"))
    *out = 0;
  else
    return fail_char(c);
  return 0;
}

/* ---- values: read into the tree, or checked and skipped ------------------- */

/* The line of positions met in order, counted from the last one asked. */
typedef struct {
  const char *at;
  int line;
} line_pos;

static int line_of(line_pos *lp, const char *at) {
  for (; lp->at < at; lp->at++)
    if (*lp->at == '\n') lp->line++;
  return lp->line;
}

static int value(ferry_json_cur *c, ferry_json_value *v, line_pos *lp);

/* Room for one more member of v (keys taken by v for an object). */
static int push(ferry_json_cur *c, ferry_json_value *v, size_t *cap, char *key) {
  if (v->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 8;
    ferry_json_value *ni = realloc(v->items, nc * sizeof *ni);
    if (!ni) return ferry_json_fail(c, "out of memory");
    v->items = ni;
    if (v->type == FERRY_JSON_OBJ) {
      char **nk = realloc(v->keys, nc * sizeof *nk);
      if (!nk) return ferry_json_fail(c, "out of memory");
      v->keys = nk;
    }
    *cap = nc;
  }
  memset(&v->items[v->n], 0, sizeof v->items[0]);
  if (v->type == FERRY_JSON_OBJ) v->keys[v->n] = key;
  v->n++;
  return 0;
}

/* An object member's key and ':'; into *key when the tree keeps it. */
static int member_key(ferry_json_cur *c, ferry_json_value *v, char **key) {
  const char *at = c->p;
  if (!v) return ferry_json_string(c, NULL, 0, NULL) || ferry_json_expect(c, ':') ? -1 : 0;
  if (ferry_json_strdup(c, key, NULL)) return -1;
  for (size_t i = 0; i < v->n; i++)
    if (!strcmp(v->keys[i], *key)) {
      c->p = at;
      ferry_json_fail(c, "duplicate key \"%s\"", *key);
      break;
    }
  if (c->err_at || ferry_json_expect(c, ':')) {
    free(*key);
    return -1;
  }
  return 0;
}

static int members(ferry_json_cur *c, ferry_json_value *v, line_pos *lp, int obj) {
  ferry_json_iter it;
  size_t cap = 0;
  int more;
  if (ferry_json_enter(c, obj ? '{' : '[', &it)) return -1;
  while ((more = ferry_json_more(c, &it)) == 1) {
    char *key = NULL;
    if (obj && member_key(c, v, &key)) return -1;
    if (v && push(c, v, &cap, key)) {
      free(key);
      return -1;
    }
    if (value(c, v ? &v->items[v->n - 1] : NULL, lp)) return -1;
  }
  return more;
}

/* One value into v, or checked and skipped when v is NULL. */
static int value(ferry_json_cur *c, ferry_json_value *v, line_pos *lp) {
  int k = ferry_json_kind(c);
  if (k < 0) return -1;
  ferry_json_value dropped; /* a skipped scalar lands here */
  ferry_json_value *o = v ? v : &dropped;
  o->type = (ferry_json_type)k;
  if (v) v->line = line_of(lp, c->p);
  switch (k) {
  case FERRY_JSON_OBJ:
  case FERRY_JSON_ARR: return members(c, v, lp, k == FERRY_JSON_OBJ);
  case FERRY_JSON_STR:
    return v ? ferry_json_strdup(c, &v->str, NULL) : ferry_json_string(c, NULL, 0, NULL);
  case FERRY_JSON_NUM: return ferry_json_number(c, &o->num, &o->is_int, &o->i);
  case FERRY_JSON_BOOL: return ferry_json_bool(c, &o->b);
  default: return word(c, "null") ? 0 : fail_char(c);
  }
}

int ferry_json_skip(ferry_json_cur *c) { return value(c, NULL, NULL); }

/* ---- the tree ------------------------------------------------------------- */

static void release(ferry_json_value *v) {
  free(v->str);
  for (size_t i = 0; i < v->n; i++) {
    release(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
}

void ferry_json_free(ferry_json_value *v) {
  if (!v) return;
  release(v);
  free(v);
}

int ferry_json_parse(const char *text, size_t len, ferry_json_value **out, char *why, size_t wl) {
  if (why && wl) why[0] = '\0';
  if (!text || !out) {
    if (why && wl) snprintf(why, wl, "no JSON text");
    return FERRY_EINVAL;
  }
  ferry_json_value *v = calloc(1, sizeof *v);
  if (!v) {
    if (why && wl) snprintf(why, wl, "out of memory");
    return FERRY_ENOMEM;
  }
  ferry_json_cur c;
  ferry_json_init(&c, text, len);
  if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) c.p += 3; /* a UTF-8 byte-order mark */
  line_pos lp = {c.begin, 1};
  int rc = value(&c, v, &lp);
  if (!rc && !ferry_json_at_end(&c))
    rc = ferry_json_fail(&c, "unexpected content after the JSON value");
  if (rc) {
    int line, col;
    ferry_json_line_col(&c, c.err_at, &line, &col);
    if (why && wl) snprintf(why, wl, "line %d, column %d: %s", line, col, c.why);
    ferry_json_free(v);
    return FERRY_ECORRUPT;
  }
  *out = v;
  return FERRY_OK;
}

const ferry_json_value *ferry_json_get(const ferry_json_value *obj, const char *key) {
  if (!obj || obj->type != FERRY_JSON_OBJ) return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}
