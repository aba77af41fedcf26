/* core/json.h — the one JSON reader of ferry (RFC 8259, strict), for the
 * safetensors headers and index, the planner's config.json and profiles, and
 * ferry-gpt's config.json and vocab.json. Two levels:
 *
 * - a cursor over a text held in memory: one value, key or bracket at a
 *   time, every read bounded by the end of the text, nesting bounded, the
 *   first error kept with where it was found; nothing is allocated except by
 *   ferry_json_strdup. Readers of a known shape (a safetensors header) walk
 *   it directly;
 * - a small tree (ferry_json_value) built on the cursor for small files read
 *   whole (ferry_json_parse): duplicate keys refused, each value's line kept.
 *
 * Strings are decoded to UTF-8; invalid UTF-8, control characters, lone
 * surrogates and \u0000 are refused. The caller formats where an error is
 * (byte offset, or line and column): the cursor gives the text of the error.
 * Internal: never included by code outside the library, its tests and
 * examples/gpt.
 */
#ifndef FERRY_CORE_JSON_H
#define FERRY_CORE_JSON_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

/* Deepest nesting of objects and arrays accepted. */
#define FERRY_JSON_MAX_DEPTH 64

typedef enum {
  FERRY_JSON_NULL,
  FERRY_JSON_BOOL,
  FERRY_JSON_NUM,
  FERRY_JSON_STR,
  FERRY_JSON_ARR,
  FERRY_JSON_OBJ
} ferry_json_type;

/* ---- the cursor ---------------------------------------------------------- */

typedef struct {
  const char *p, *end, *begin;
  int depth;          /* open objects and arrays */
  const char *err_at; /* where the first error was found; NULL while none */
  char why[200];      /* its text */
} ferry_json_cur;

/* The members of one object or array, walked with ferry_json_more. */
typedef struct {
  char close; /* '}' or ']' */
  size_t n;   /* members seen */
} ferry_json_iter;

void ferry_json_init(ferry_json_cur *c, const char *text, size_t len);
/* Records an error at the cursor unless one is recorded already; returns -1.
 * Readers of a known shape use it for errors of that shape too. */
int ferry_json_fail(ferry_json_cur *c, const char *fmt, ...) FERRY_PRINTF(2, 3);
/* Line and column (from 1) of a position in the text. */
void ferry_json_line_col(const ferry_json_cur *c, const char *at, int *line, int *col);

/* The next byte after white space (which it skips), or -1 at the end. */
int ferry_json_peek(ferry_json_cur *c);
/* 1 when the next byte is ch (consumed), else 0. */
int ferry_json_eat(ferry_json_cur *c, char ch);
/* 0 when the next byte is ch (consumed), else -1 with "expected 'ch'". */
int ferry_json_expect(ferry_json_cur *c, char ch);
/* 1 when only white space is left. */
int ferry_json_at_end(ferry_json_cur *c);
/* The type of the value that starts next, from its first byte, or -1 with an
 * error ("unexpected end of input", "unexpected character ..."). */
int ferry_json_kind(ferry_json_cur *c);

/* Opens the object ('{') or array ('[') that must come next. */
int ferry_json_enter(ferry_json_cur *c, char open, ferry_json_iter *it);
/* 1 when another member follows (its separating comma read; for an object
 * the key's opening quote is checked), 0 after the closing bracket, -1 on an
 * error (a trailing comma, a missing comma). An object's member is then read
 * as a string, ':' and a value. */
int ferry_json_more(ferry_json_cur *c, ferry_json_iter *it);

/* A string, decoded into buf (cap bytes, NUL-terminated; what does not fit
 * is left out). *len (when not NULL) gets the whole decoded length; buf may
 * be NULL with cap 0 to check and skip a string. */
int ferry_json_string(ferry_json_cur *c, char *buf, size_t cap, size_t *len);
/* A string decoded into a fresh NUL-terminated allocation (free it). */
int ferry_json_strdup(ferry_json_cur *c, char **out, size_t *len);
/* A number. *is_int is set when it is written as an integer that fits
 * int64 (then *i holds it exactly); either pointer may be NULL. */
int ferry_json_number(ferry_json_cur *c, double *num, int *is_int, int64_t *i);
/* A non-negative integer below 2^64: no sign, fraction, exponent or leading
 * zero. */
int ferry_json_u64(ferry_json_cur *c, uint64_t *out);
/* true or false. */
int ferry_json_bool(ferry_json_cur *c, int *out);
/* Any one value (checked as strictly as when it is read). */
int ferry_json_skip(ferry_json_cur *c);

/* Decodes the UTF-8 sequence at s (n bytes left) into *cp (when not NULL);
 * returns its length (1 to 4), or 0 when it is not valid UTF-8 (overlong
 * forms, surrogates and values past U+10FFFF are not). */
size_t ferry_utf8_get(const unsigned char *s, size_t n, unsigned *cp);

/* ---- the tree ------------------------------------------------------------- */

typedef struct ferry_json_value ferry_json_value;
struct ferry_json_value {
  ferry_json_type type;
  int b;                   /* FERRY_JSON_BOOL */
  double num;              /* FERRY_JSON_NUM */
  int is_int;              /* the number is written as an integer that fits int64 */
  int64_t i;               /* ... and this is it */
  char *str;               /* FERRY_JSON_STR (decoded, NUL-terminated) */
  char **keys;             /* FERRY_JSON_OBJ: n keys */
  ferry_json_value *items; /* FERRY_JSON_ARR / FERRY_JSON_OBJ: n values */
  size_t n;
  int line; /* where the value starts */
};

/* Parses one whole JSON text (a UTF-8 byte-order mark is skipped). Returns
 * FERRY_OK, FERRY_EINVAL (no text), FERRY_ENOMEM or FERRY_ECORRUPT with
 * "line L, column C: what" in why. */
int ferry_json_parse(const char *text, size_t len, ferry_json_value **out, char *why, size_t wl);
void ferry_json_free(ferry_json_value *v);
/* The member `key` of an object, or NULL. */
const ferry_json_value *ferry_json_get(const ferry_json_value *obj, const char *key);

#endif /* FERRY_CORE_JSON_H */
