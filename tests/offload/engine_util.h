/* tests/offload/engine_util.h — what the small engine tests share: an
 * engine from the text of a configuration, on the caller's device or on
 * the one the configuration names (exits the test when refused); the text
 * of a small host-device configuration with an NVMe tier of its own; the
 * MPI communicator of a test under mpirun (skips the test without MPI or
 * with another number of ranks).
 */
#ifndef FERRY_TESTS_ENGINE_UTIL_H
#define FERRY_TESTS_ENGINE_UTIL_H

#include "ferry.h"
#include "tests/test.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Into text (cap bytes): a configuration on the host device with 4K
 * chunks, a 1M device budget, a 16M unpinned host pool and an NVMe tier in
 * a folder of this process under scratch (both made here), then `more`
 * (the other lines: step mode, optimizer, precision, placement; at most
 * 1100 bytes); text takes 2400 bytes. */
static inline void eu_nvme_text(char *text, size_t cap, const char *scratch, const char *more) {
  char nvme[1200];
  snprintf(nvme, sizeof nvme, "%.1000s/nvme-%ld", scratch, (long)getpid());
  mkdir(scratch, 0755);
  mkdir(nvme, 0755);
  snprintf(text, cap,
           "device = \"host\";\n"
           "chunk_size = \"4K\";\n"
           "tiers: { gpu: { budget = \"1M\"; }; host: { budget = \"16M\"; pinned = false; };\n"
           "         nvme: { paths = [\"%.1000s\"]; block_size = \"4K\"; queue_depth = 8; }; "
           "};\n%.1100s",
           nvme, more);
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
