/* tests/comm/test_linked_mpi.c — a program that links libmpi itself, calls
 * MPI_Init_thread and uses MPI_COMM_WORLD in its own code (so the program
 * holds a copy-relocated ompi_mpi_comm_world), then makes ferry's MPI
 * communicator, which opens libmpi itself: ferry must use the handles the
 * process uses (a dlsym of libmpi's own object crashed MPI_Comm_dup). Run
 * under mpirun with 2 ranks. */
#include <mpi.h>
#include <stdio.h>

#include "ferry.h"

int main(int argc, char **argv) {
  int provided = 0, rank = -1, size = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 2;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ferry_comm_options o = ferry_comm_options_default();
  o.kind = FERRY_COMM_MPI;
  o.timeout = 30;
  ferry_comm *c = NULL;
  int st = ferry_comm_create(&o, &c);
  if (st) {
    fprintf(stderr, "rank %d: ferry_comm_create: %s\n", rank, ferry_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int bad = ferry_comm_rank(c) != rank || ferry_comm_size(c) != size;
  float v[4] = {1.0f * rank, 2.0f, 3.0f, 4.0f};
  st = ferry_comm_allreduce(c, v, v, 4, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL);
  float want0 = 0.5f * (float)(size * (size - 1));
  bad |= st != 0 || v[0] != want0 || v[1] != 2.0f * (float)size;
  ferry_comm_destroy(c);
  /* the program's own MPI still works after ferry's communicator is gone */
  int sum = 0, one = 1;
  bad |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS || sum != size;
  printf("rank %d of %d: %s\n", rank, size, bad ? "FAILED" : "ok");
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
