/* comm/mpi_abi.h — OpenMPI opened at run time for the mpi backend: the MPI
 * functions it calls and the predefined handles it passes, in one table
 * filled from libmpi.so.40 with dlopen and dlsym (comm/mpi_abi.c, the one
 * file that knows OpenMPI's ABI). libferry does not link libmpi: a process
 * that makes no MPI or NCCL communicator maps none.
 *
 * mpi.h gives the types and the plain integer constants (MPI_SUCCESS,
 * MPI_IN_PLACE, MPI_THREAD_MULTIPLE, ...). Its handle macros name link-time
 * objects of libmpi, so this header removes the ones the backend used to
 * call: code outside mpi_abi.c takes them from the table.
 */
#ifndef FERRY_COMM_MPI_ABI_H
#define FERRY_COMM_MPI_ABI_H

#include "core/core.h"

#include <mpi.h>

#undef MPI_COMM_WORLD
#undef MPI_COMM_NULL
#undef MPI_INFO_NULL
#undef MPI_ERRORS_RETURN
#undef MPI_DATATYPE_NULL
#undef MPI_BYTE
#undef MPI_CHAR
#undef MPI_FLOAT
#undef MPI_DOUBLE
#undef MPI_INT32_T
#undef MPI_INT64_T
#undef MPI_UINT8_T
#undef MPI_UINT16_T
#undef MPI_UINT32_T
#undef MPI_UINT64_T
#undef MPI_OP_NULL
#undef MPI_SUM
#undef MPI_MAX
#undef MPI_MIN

typedef struct {
  /* functions: MPI_<name> */
  __typeof__(MPI_Init_thread) *Init_thread;
  __typeof__(MPI_Initialized) *Initialized;
  __typeof__(MPI_Finalized) *Finalized;
  __typeof__(MPI_Finalize) *Finalize;
  __typeof__(MPI_Query_thread) *Query_thread;
  __typeof__(MPI_Abort) *Abort;
  __typeof__(MPI_Error_string) *Error_string;
  __typeof__(MPI_Comm_set_errhandler) *Comm_set_errhandler;
  __typeof__(MPI_Comm_dup) *Comm_dup;
  __typeof__(MPI_Comm_free) *Comm_free;
  __typeof__(MPI_Comm_rank) *Comm_rank;
  __typeof__(MPI_Comm_size) *Comm_size;
  __typeof__(MPI_Comm_split_type) *Comm_split_type;
  __typeof__(MPI_Barrier) *Barrier;
  __typeof__(MPI_Bcast) *Bcast;
  __typeof__(MPI_Allreduce) *Allreduce;
  __typeof__(MPI_Reduce_scatter) *Reduce_scatter;
  __typeof__(MPI_Allgatherv) *Allgatherv;
  __typeof__(MPI_Isend) *Isend;
  __typeof__(MPI_Testall) *Testall;
  __typeof__(MPI_Improbe) *Improbe;
  __typeof__(MPI_Mrecv) *Mrecv;
  /* predefined handles: MPI_<NAME> */
  MPI_Comm comm_world, comm_null;
  MPI_Info info_null;
  MPI_Errhandler errors_return;
  MPI_Datatype datatype_null, byte, char_, float_, double_, int32, int64, uint8, uint16, uint32,
      uint64;
  MPI_Op op_null, sum, max, min;
} ferry_mpi_abi;

/* The table; opens libmpi at the first call. FERRY_ENOTSUP naming the
 * library and dlerror() when it cannot. Thread-safe; the table never
 * changes once filled, and libmpi stays open. */
int ferry_mpi_abi_load(ferry_errbuf *e, const ferry_mpi_abi **out);

/* The table when libmpi is in this process already (opened by the first
 * call above, or linked by the program), without opening it; else NULL. */
const ferry_mpi_abi *ferry_mpi_abi_loaded(void);

#endif /* FERRY_COMM_MPI_ABI_H */
