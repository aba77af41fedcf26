/* format/json_writer.c — the streaming JSON writer of format/json_writer.h. */
#include "format/json_writer.h"

#include <math.h>

void json_string_raw(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void sep(json_out *j) {
  if (!j->first[j->depth]) fputc(',', j->f);
  j->first[j->depth] = 0;
}

void json_key(json_out *j, const char *key) {
  sep(j);
  if (key) {
    json_string_raw(j->f, key);
    fputc(':', j->f);
  }
}

void json_begin(json_out *j, FILE *f) {
  j->f = f;
  j->depth = 0;
  j->first[0] = 1;
  fputc('{', f);
}

void json_end(json_out *j) {
  fputs("}\n", j->f);
  fflush(j->f);
}

void json_str(json_out *j, const char *key, const char *v) {
  json_key(j, key);
  json_string_raw(j->f, v);
}
void json_int(json_out *j, const char *key, long long v) {
  json_key(j, key);
  fprintf(j->f, "%lld", v);
}
void json_uint(json_out *j, const char *key, unsigned long long v) {
  json_key(j, key);
  fprintf(j->f, "%llu", v);
}
void json_num(json_out *j, const char *key, double v) {
  json_key(j, key);
  if (isfinite(v)) fprintf(j->f, "%.6g", v);
  else fputs("null", j->f);
}
void json_bool(json_out *j, const char *key, int v) {
  json_key(j, key);
  fputs(v ? "true" : "false", j->f);
}
void json_null(json_out *j, const char *key) {
  json_key(j, key);
  fputs("null", j->f);
}
void json_open(json_out *j, const char *key, char bracket) {
  json_key(j, key);
  fputc(bracket, j->f);
  if (j->depth < 15) j->depth++;
  j->first[j->depth] = 1;
}
void json_close(json_out *j, char bracket) {
  fputc(bracket, j->f);
  if (j->depth > 0) j->depth--;
}
