/* comm/mpi_abi.c — OpenMPI's binary interface, and the only file that
 * depends on it: the library's name (libmpi.so.40, Debian's libopenmpi3),
 * the exported names of its functions (MPI_*) and of its predefined objects
 * (ompi_mpi_comm_world, ...), and that a handle such as MPI_COMM_WORLD is
 * the address of that object (what mpi.h's OMPI_PREDEFINED_GLOBAL does at
 * link time, done here with dlsym). Another MPI (MPICH's libmpi.so.12,
 * whose handles are integers) would need a file of its own.
 *
 * libmpi is opened with RTLD_GLOBAL: OpenMPI's components (mca_*.so, which
 * it opens itself) resolve its symbols from the global scope.
 */
#include "comm/mpi_abi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIBMPI "libmpi.so.40"

_Static_assert(sizeof(MPI_Comm) == sizeof(void *) && sizeof(MPI_Op) == sizeof(void *) &&
                   sizeof(MPI_Datatype) == sizeof(void *) && sizeof(MPI_Info) == sizeof(void *) &&
                   sizeof(MPI_Errhandler) == sizeof(void *),
               "OpenMPI's handles are pointers to its predefined objects");
_Static_assert(sizeof(void (*)(void)) == sizeof(void *), "dlsym gives function pointers");

/* Each entry of the table: the symbol and where its address goes. */
typedef struct {
  const char *sym;
  size_t off;
  int object; /* a predefined object (a handle), not a function */
} abi_entry;

#define FN(name)                                                                                   \
  { "MPI_" #name, offsetof(ferry_mpi_abi, name), 0 }
#define OBJ(sym, field)                                                                            \
  { sym, offsetof(ferry_mpi_abi, field), 1 }

static const abi_entry k_entries[] = {
    FN(Init_thread),
    FN(Initialized),
    FN(Finalized),
    FN(Finalize),
    FN(Query_thread),
    FN(Abort),
    FN(Error_string),
    FN(Comm_set_errhandler),
    FN(Comm_dup),
    FN(Comm_free),
    FN(Comm_rank),
    FN(Comm_size),
    FN(Comm_split_type),
    FN(Barrier),
    FN(Bcast),
    FN(Allreduce),
    FN(Reduce_scatter),
    FN(Allgatherv),
    FN(Isend),
    FN(Testall),
    FN(Improbe),
    FN(Mrecv),
    OBJ("ompi_mpi_comm_world", comm_world),
    OBJ("ompi_mpi_comm_null", comm_null),
    OBJ("ompi_mpi_info_null", info_null),
    OBJ("ompi_mpi_errors_return", errors_return),
    OBJ("ompi_mpi_datatype_null", datatype_null),
    OBJ("ompi_mpi_byte", byte),
    OBJ("ompi_mpi_char", char_),
    OBJ("ompi_mpi_float", float_),
    OBJ("ompi_mpi_double", double_),
    OBJ("ompi_mpi_int32_t", int32),
    OBJ("ompi_mpi_int64_t", int64),
    OBJ("ompi_mpi_uint8_t", uint8),
    OBJ("ompi_mpi_uint16_t", uint16),
    OBJ("ompi_mpi_uint32_t", uint32),
    OBJ("ompi_mpi_uint64_t", uint64),
    OBJ("ompi_mpi_op_null", op_null),
    OBJ("ompi_mpi_op_sum", sum),
    OBJ("ompi_mpi_op_max", max),
    OBJ("ompi_mpi_op_min", min),
};
_Static_assert(sizeof k_entries / sizeof *k_entries == sizeof(ferry_mpi_abi) / sizeof(void *),
               "one symbol per entry of the table");

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ferry_mpi_abi g_abi; /* (g_mu until g_ready) */
static int g_ready;         /* (g_mu) g_abi is filled */

/* Fills g_abi from h; the first missing symbol's name, or NULL. A handle
 * is looked up in the global scope first: a program that links libmpi
 * itself (and calls MPI_Init, as dist.h allows) holds a copy-relocated
 * ompi_mpi_comm_world that libmpi uses instead of its own, and
 * dlsym(h, ...) would give libmpi's unused original. */
static const char *fill(void *h) {
  ferry_mpi_abi t;
  for (size_t i = 0; i < sizeof k_entries / sizeof *k_entries; i++) {
    void *p = k_entries[i].object ? dlsym(RTLD_DEFAULT, k_entries[i].sym) : NULL;
    if (!p) p = dlsym(h, k_entries[i].sym);
    if (!p) return k_entries[i].sym;
    memcpy((char *)&t + k_entries[i].off, &p, sizeof p);
  }
  g_abi = t;
  g_ready = 1;
  return NULL;
}

/* dlopen of libmpi: $FERRY_LIBMPI alone when set (an OpenMPI outside the
 * loader's path), else the soname, then where the build found it. NULL
 * with the name tried first and dlerror()'s reason in why. */
static void *open_libmpi(int flags, char *why, size_t len) {
  const char *env = getenv("FERRY_LIBMPI");
  int own = env && env[0];
  const char *name = own ? env : LIBMPI;
  void *h = dlopen(name, flags);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, len, "%s (%s)", name, e ? e : "dlopen failed");
  }
#ifdef FERRY_MPI_PATH
  if (!h && !own) h = dlopen(FERRY_MPI_PATH, flags);
#endif
  return h;
}

int ferry_mpi_abi_load(ferry_errbuf *e, const ferry_mpi_abi **out) {
  int st = 0;
  pthread_mutex_lock(&g_mu);
  if (!g_ready) {
    char why[FERRY_ERR_MAX / 2];
    void *h = open_libmpi(RTLD_NOW | RTLD_GLOBAL, why, sizeof why);
    const char *missing = NULL;
    if (!h) {
      st = ferry_err(e, FERRY_ENOTSUP,
                     "mpi: cannot load OpenMPI's library %s: install it (Debian: libopenmpi3, "
                     "with openmpi-bin for mpirun), set FERRY_LIBMPI to its path, or use the "
                     "self communicator",
                     why);
    } else if ((missing = fill(h)) != NULL) {
      dlclose(h);
      st =
          ferry_err(e, FERRY_ENOTSUP,
                    "mpi: the library opened has no %s: ferry's mpi backend needs OpenMPI's " LIBMPI
                    " (OpenMPI 4 or later)",
                    missing);
    }
  }
  *out = g_ready ? &g_abi : NULL;
  pthread_mutex_unlock(&g_mu);
  return st;
}

const ferry_mpi_abi *ferry_mpi_abi_loaded(void) {
  pthread_mutex_lock(&g_mu);
  if (!g_ready) {
    char why[FERRY_ERR_MAX / 2];
    void *h = open_libmpi(RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD, why, sizeof why);
    if (h && fill(h)) dlclose(h);
  }
  const ferry_mpi_abi *a = g_ready ? &g_abi : NULL;
  pthread_mutex_unlock(&g_mu);
  return a;
}
