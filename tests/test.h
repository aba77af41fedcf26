/* tests/test.h — the tiny harness every test program uses: checks that
 * print file, line and the failed expression, exit codes 0 pass, 1 fail,
 * 77 skip (with a one-line reason).
 */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int test_failures;

#define TEST_SKIP_CODE 77

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);   \
      test_failures++;                                                    \
    }                                                                     \
  } while (0)

#define REQUIRE(cond)                                                     \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: FAILED (fatal): %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

#define EXPECT_EQ_INT(a, b)                                                           \
  do {                                                                                \
    long long a_ = (long long)(a), b_ = (long long)(b);                               \
    if (a_ != b_) {                                                                   \
      fprintf(stderr, "%s:%d: FAILED: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, \
              #a, #b, a_, b_);                                                        \
      test_failures++;                                                                \
    }                                                                                 \
  } while (0)

#define TEST_SKIP(...)                       \
  do {                                       \
    printf("SKIP: " __VA_ARGS__);            \
    printf("\n");                            \
    exit(TEST_SKIP_CODE);                    \
  } while (0)

static inline int test_finish(const char *name) {
  if (test_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

/* A deterministic xorshift generator for test data. */
static inline unsigned long long test_rand(unsigned long long *s) {
  unsigned long long x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

#endif
