/* tests/plan/profile_util.h — what the planner's tests share: a profile
 * file as `ferry bench all` writes one, with the caller's figures.
 */
#ifndef FERRY_TESTS_PLAN_PROFILE_UTIL_H
#define FERRY_TESTS_PLAN_PROFILE_UTIL_H

#include "tests/test.h"

#include <stdio.h>

/* Writes path: a ferry-profile of version 1 whose other keys are `fields`
 * (JSON members, e.g. "\"h2d_gbps\": 11"). */
static inline void write_profile(const char *path, const char *fields) {
  FILE *f = fopen(path, "w");
  REQUIRE(f);
  fprintf(f, "{\"format\": \"ferry-profile\", \"version\": 1, %s}\n", fields);
  fclose(f);
}

#endif
