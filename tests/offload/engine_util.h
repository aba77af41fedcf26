/* tests/offload/engine_util.h — what the small engine tests share: an
 * engine from the text of a configuration, on the caller's device or on
 * the one the configuration names (exits the test when refused); the MPI
 * communicator of a test under mpirun (skips the test without MPI or with
 * another number of ranks).
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

static inline ferry_comm *eu_mpi_comm(int nranks) {
  if (!ferry_comm_compiled(FERRY_COMM_MPI)) TEST_SKIP("this build has no MPI");
  ferry_comm_options co = ferry_comm_options_default();
  co.kind = FERRY_COMM_MPI;
  co.timeout = 60;
  ferry_comm *comm = NULL;
  int rc = ferry_comm_create(&co, &comm);
  if (rc) fprintf(stderr, "comm: %s\n", ferry_last_error());
  REQUIRE(rc == 0);
  if (ferry_comm_size(comm) != nranks) {
    ferry_comm_destroy(comm);
    TEST_SKIP("needs %d ranks (mpirun -np %d)", nranks, nranks);
  }
  return comm;
}

#endif
