/* tests/offload/test_cancel_ranks.c — under `mpirun -np 2` (host backend):
 * a cancel on one rank's finalize stops every rank's. Rank 0's cancel says
 * yes at its third ask; rank 1 has no cancel of its own. Rank 0 tells rank
 * 1 (ferry_comm_cancel), whose finalize stops at its next ask, before its
 * last init callback (each takes 50 ms), and the agreement at finalize's
 * end makes both fail with FERRY_ECANCELED, rank 1 naming rank 0. Then the
 * same with the cancel on both ranks. The communicator stays whole (a
 * barrier after), and the job ends without an abort.
 */
#include "ferry.h"
#include "tests/offload/engine_util.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NP 24
#define N 256

static int rank;
static atomic_int g_asks, g_inits;
static int g_yes_at; /* this rank's cancel says yes from this ask on */

static int cancel(void *user) {
  (void)user;
  return atomic_fetch_add(&g_asks, 1) + 1 >= g_yes_at;
}

static int init(void *user, const char *name, float *dst, size_t n) {
  (void)user, (void)name;
  atomic_fetch_add(&g_inits, 1);
  struct timespec ts = {0, 50 * 1000000};
  nanosleep(&ts, NULL);
  for (size_t i = 0; i < n; i++) dst[i] = 0.01f * (float)i;
  return 0;
}

/* finalize with the cancel on the ranks in `on` (a bit per rank). */
static void check(ferry_comm *comm, unsigned on) {
  ferry_engine *e = eu_engine("device = \"host\";\n"
                              "chunk_size = \"4K\";\n"
                              "tiers: { gpu: { budget = \"4M\"; }; host: { budget = \"32M\"; "
                              "pinned = false; }; };\n"
                              "placement: { params = \"host\"; grads = \"host\"; "
                              "optimizer = \"host\"; };\n"
                              "dist: { zero_stage = 2; };\n",
                              NULL);
  atomic_store(&g_asks, 0);
  atomic_store(&g_inits, 0);
  g_yes_at = 3;
  if (on & (1u << rank)) REQUIRE(ferry_engine_set_cancel(e, cancel, NULL) == 0);
  for (int k = 0; k < NP; k++) {
    char name[32];
    snprintf(name, sizeof name, "p%d.w", k);
    int64_t shape[1] = {N};
    REQUIRE(ferry_param_register(e, name, shape, 1, k / 4, NULL, init, NULL) == 0);
  }
  REQUIRE(ferry_engine_set_comm(e, comm) == 0);
  int rc = ferry_engine_finalize(e);
  int inits = atomic_load(&g_inits);
  printf("  rank %d: finalize: %s after %d of %d init callbacks: %s\n", rank, ferry_strerror(rc),
         inits, NP, ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, FERRY_ECANCELED);
  EXPECT(inits < NP); /* stopped early, on the rank that was told too */
  if (!(on & (1u << rank)))
    EXPECT(strstr(ferry_engine_last_error(e), "rank 0") != NULL);
  ferry_engine_destroy(e);
  EXPECT_EQ_INT(ferry_comm_barrier(comm, NULL), 0);
}

int main(void) {
  ferry_comm *comm = eu_mpi_comm(2);
  rank = ferry_comm_rank(comm);
  if (rank == 0) printf("-- the cancel on rank 0 alone\n");
  check(comm, 1u);
  if (rank == 0) printf("-- the cancel on both ranks\n");
  check(comm, 3u);
  ferry_comm_destroy(comm);
  return test_finish("offload.cancel_ranks");
}
