/* examples/gpt/json.c — a bounded JSON cursor for config.json and
 * vocab.json (objects, arrays, strings with \u escapes, numbers, literals).
 */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gj_ws(gj *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

int gj_peek(gj *j) {
  gj_ws(j);
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

int gj_eat(gj *j, char c) {
  if (gj_peek(j) == (unsigned char)c) {
    j->p++;
    return 1;
  }
  return 0;
}

static int hex4(const char *p, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    int c = (unsigned char)p[i], h;
    if (c >= '0' && c <= '9') h = c - '0';
    else if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
    else return -1;
    *v = *v * 16 + (unsigned)h;
  }
  return 0;
}

static void put(char *buf, size_t cap, size_t *n, char c) {
  if (*n + 1 < cap) buf[*n] = c;
  (*n)++;
}

long gj_string(gj *j, char *buf, size_t cap) {
  if (!gj_eat(j, '"')) return j->bad = 1, -1;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    char c = *j->p++;
    if (c != '\\') {
      put(buf, cap, &n, c);
      continue;
    }
    if (j->p >= j->end) break;
    c = *j->p++;
    switch (c) {
    case 'n': put(buf, cap, &n, '\n'); break;
    case 't': put(buf, cap, &n, '\t'); break;
    case 'r': put(buf, cap, &n, '\r'); break;
    case 'b': put(buf, cap, &n, '\b'); break;
    case 'f': put(buf, cap, &n, '\f'); break;
    case 'u': {
      unsigned cp, lo;
      if (j->end - j->p < 4 || hex4(j->p, &cp)) return j->bad = 1, -1;
      j->p += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' &&
          j->p[1] == 'u' && !hex4(j->p + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        j->p += 6;
      }
      if (cp < 0x80) {
        put(buf, cap, &n, (char)cp);
      } else if (cp < 0x800) {
        put(buf, cap, &n, (char)(0xC0 | (cp >> 6)));
        put(buf, cap, &n, (char)(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        put(buf, cap, &n, (char)(0xE0 | (cp >> 12)));
        put(buf, cap, &n, (char)(0x80 | ((cp >> 6) & 0x3F)));
        put(buf, cap, &n, (char)(0x80 | (cp & 0x3F)));
      } else {
        put(buf, cap, &n, (char)(0xF0 | (cp >> 18)));
        put(buf, cap, &n, (char)(0x80 | ((cp >> 12) & 0x3F)));
        put(buf, cap, &n, (char)(0x80 | ((cp >> 6) & 0x3F)));
        put(buf, cap, &n, (char)(0x80 | (cp & 0x3F)));
      }
      break;
    }
    default: put(buf, cap, &n, c); break; /* \" \\ \/ */
    }
  }
  if (j->p >= j->end) return j->bad = 1, -1;
  j->p++;
  if (cap) buf[n < cap ? n : cap - 1] = 0;
  return (long)n;
}

int gj_number(gj *j, double *out) {
  gj_ws(j);
  char tmp[64];
  size_t n = 0;
  while (j->p + n < j->end && n < sizeof tmp - 1 && strchr("+-.eE0123456789", j->p[n]))
    tmp[n] = j->p[n], n++;
  tmp[n] = 0;
  char *e;
  double v = strtod(tmp, &e);
  if (n == 0 || *e) return j->bad = 1, -1;
  j->p += n;
  *out = v;
  return 0;
}

int gj_kind(gj *j) {
  int c = gj_peek(j);
  if (c == '"') return 's';
  if (c == '{') return 'o';
  if (c == '[') return 'a';
  if (c == 't') return 't';
  if (c == 'f') return 'f';
  if (c == 'n') return 'z';
  if (c == '-' || (c >= '0' && c <= '9')) return 'n';
  return 0;
}

int gj_skip(gj *j, int depth) {
  if (depth > 64) return j->bad = 1, -1;
  int k = gj_kind(j);
  double d;
  switch (k) {
  case 's': return gj_string(j, NULL, 0) < 0 ? -1 : 0;
  case 'n': return gj_number(j, &d);
  case 't': if (j->end - j->p >= 4 && !memcmp(j->p, "true", 4)) return j->p += 4, 0; break;
  case 'f': if (j->end - j->p >= 5 && !memcmp(j->p, "false", 5)) return j->p += 5, 0; break;
  case 'z': if (j->end - j->p >= 4 && !memcmp(j->p, "null", 4)) return j->p += 4, 0; break;
  case 'o':
  case 'a': {
    char close = k == 'o' ? '}' : ']';
    j->p++;
    if (gj_eat(j, close)) return 0;
    for (;;) {
      if (k == 'o' && (gj_string(j, NULL, 0) < 0 || !gj_eat(j, ':'))) return j->bad = 1, -1;
      if (gj_skip(j, depth + 1)) return -1;
      if (gj_eat(j, ',')) continue;
      if (gj_eat(j, close)) return 0;
      return j->bad = 1, -1;
    }
  }
  default: break;
  }
  return j->bad = 1, -1;
}

char *gj_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap + 1);
  while (b) {
    size_t r = fread(b + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    cap *= 2;
    char *nb = realloc(b, cap + 1);
    if (!nb) free(b);
    b = nb;
  }
  int err = ferror(f);
  fclose(f);
  if (!b || err) {
    free(b);
    return NULL;
  }
  b[n] = 0;
  if (len) *len = n;
  return b;
}
