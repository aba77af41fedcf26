/* tests/offload/engine_util.h — what the small engine tests share: an
 * engine from the text of a configuration, on the caller's device or on
 * the one the configuration names (exits the test when refused).
 */
#ifndef FERRY_TESTS_ENGINE_UTIL_H
#define FERRY_TESTS_ENGINE_UTIL_H

#include "ferry.h"
#include "tests/test.h"

static inline ferry_engine *eu_engine(const char *text, ferry_device *dev) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  int rc = ferry_config_load_string(c, text, "test.cfg");
  if (rc) fprintf(stderr, "config: %s\n", ferry_config_last_error(c));
  REQUIRE(rc == 0);
  ferry_engine *e = NULL;
  rc = ferry_engine_create(c, dev, &e);
  if (rc) fprintf(stderr, "engine create: %s\n", ferry_last_error());
  ferry_config_destroy(c);
  REQUIRE(rc == 0);
  return e;
}

#endif
