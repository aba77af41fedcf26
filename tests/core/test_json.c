/* tests/core/test_json.c — the cursor of core/json.h as its readers of a
 * known shape use it (members, strings into small buffers, unsigned
 * integers, skipping, the first error and where), UTF-8 decoding, and
 * ferry_read_file's limit. The tree and its messages are tested through the
 * planner (tests/plan/test_models.c).
 */
#include "core/file.h"
#include "core/json.h"
#include "tests/test.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static ferry_json_cur cur(const char *text) {
  ferry_json_cur c;
  ferry_json_init(&c, text, strlen(text));
  return c;
}

/* The error of reading `text` as one unsigned integer. */
static const char *u64_error(const char *text) {
  static ferry_json_cur c;
  uint64_t v;
  c = cur(text);
  return ferry_json_u64(&c, &v) ? c.why : "";
}

static void test_members(void) {
  ferry_json_cur c = cur(" {\"a\": [1, 2], \"long key\": \"x\\u00e9y\", \"s\": {\"t\": null}} ");
  ferry_json_iter it, arr;
  char key[4];
  size_t kl;
  int more, n = 0;
  REQUIRE(ferry_json_enter(&c, '{', &it) == 0);
  while ((more = ferry_json_more(&c, &it)) == 1) {
    REQUIRE(ferry_json_string(&c, key, sizeof key, &kl) == 0 && ferry_json_expect(&c, ':') == 0);
    if (n == 0) {
      EXPECT(!strcmp(key, "a") && kl == 1 && ferry_json_kind(&c) == FERRY_JSON_ARR);
      uint64_t v, sum = 0;
      REQUIRE(ferry_json_enter(&c, '[', &arr) == 0);
      while (ferry_json_more(&c, &arr) == 1 && ferry_json_u64(&c, &v) == 0)
        sum += v;
      EXPECT(sum == 3 && arr.n == 2);
    } else if (n == 1) {
      EXPECT(!strcmp(key, "lon") && kl == 8); /* cut to the buffer, whole length told */
      char *s;
      size_t sl;
      REQUIRE(ferry_json_strdup(&c, &s, &sl) == 0);
      EXPECT(!strcmp(s, "x\xc3\xa9y") && sl == 4);
      free(s);
    } else {
      EXPECT(ferry_json_skip(&c) == 0);
    }
    n++;
  }
  EXPECT(more == 0 && n == 3 && c.depth == 0 && ferry_json_at_end(&c) && !c.err_at);
}

static void test_errors(void) {
  EXPECT(strstr(u64_error("-1"), "unsigned"));
  EXPECT(strstr(u64_error("1.0"), "expected an integer"));
  EXPECT(strstr(u64_error("1e3"), "expected an integer"));
  EXPECT(strstr(u64_error("01"), "leading zero"));
  EXPECT(strstr(u64_error("18446744073709551616"), "64 bits"));
  EXPECT(!strcmp(u64_error("18446744073709551615"), ""));
  /* the first error is kept, with where it was found */
  ferry_json_cur c = cur("[1, 2,]");
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "trailing comma in array"));
  EXPECT(c.err_at == c.begin + 6);
  EXPECT(ferry_json_fail(&c, "later") < 0 && strstr(c.why, "trailing comma"));
  c = cur("{\"a\":\n  tru}");
  int line, col;
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "unexpected character 't'"));
  ferry_json_line_col(&c, c.err_at, &line, &col);
  EXPECT(line == 2 && col == 3);
  c = cur("[\"\\q\"]");
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "invalid escape") && strstr(c.why, "bad escape"));
  c = cur("[\"\\u0000\"]");
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "NUL"));
  c = cur("[\x01]");
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "unexpected byte 0x01"));
  char deep[200];
  memset(deep, '[', 100);
  memset(deep + 100, ']', 99);
  deep[199] = '\0';
  c = cur(deep);
  EXPECT(ferry_json_skip(&c) < 0 && strstr(c.why, "nesting deeper than 64"));
  c = cur("{\"a\" 1}");
  ferry_json_iter it;
  EXPECT(ferry_json_enter(&c, '{', &it) == 0 && ferry_json_more(&c, &it) == 1);
  EXPECT(ferry_json_string(&c, NULL, 0, NULL) == 0 && ferry_json_expect(&c, ':') < 0);
  EXPECT(strstr(c.why, "expected ':'"));
}

static void test_utf8(void) {
  unsigned cp = 0;
  EXPECT(ferry_utf8_get((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp) == 4 && cp == 0x1F600);
  EXPECT(ferry_utf8_get((const unsigned char *)"\xc0\xaf", 2, &cp) == 0);     /* overlong */
  EXPECT(ferry_utf8_get((const unsigned char *)"\xed\xa0\x80", 3, &cp) == 0); /* surrogate */
  EXPECT(ferry_utf8_get((const unsigned char *)"\xe2\x82", 2, &cp) == 0);     /* cut short */
}

static void test_read_file(void) {
  char path[] = "/tmp/ferry_test_json_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "{\"a\": 1}", 8) == 8);
  close(fd);
  char *text, why[256];
  size_t len;
  EXPECT(ferry_read_file(path, 8, &text, &len, why, sizeof why) == FERRY_OK);
  EXPECT(len == 8 && text[8] == '\0' && !strcmp(text, "{\"a\": 1}"));
  free(text);
  EXPECT(ferry_read_file(path, 7, &text, &len, why, sizeof why) == FERRY_EOVERFLOW);
  EXPECT(strstr(why, "larger than 7 bytes"));
  unlink(path);
  EXPECT(ferry_read_file(path, 8, &text, &len, why, sizeof why) == FERRY_ENOENT);
  EXPECT(strstr(why, "cannot open"));
}

int main(void) {
  test_members();
  test_errors();
  test_utf8();
  test_read_file();
  return test_finish("test_json");
}
