#!/bin/sh
# tests/comm/unlinked_mpi.sh — the library and the programs do not link
# OpenMPI: no libmpi among their needed libraries and no MPI or OpenMPI
# symbol left for the loader to bind (comm/mpi_abi.c opens libmpi with
# dlopen when the first MPI communicator is made).
#   unlinked_mpi.sh FILE...
rc=0
for f in "$@"; do
  if [ ! -f "$f" ]; then
    echo "unlinked_mpi: FAILED: $f is not built"
    rc=1
    continue
  fi
  need=$(readelf -d "$f" | grep NEEDED | grep -E 'libmpi|libopen-(pal|rte)')
  syms=$(nm -D --undefined-only "$f" | grep -E ' (P?MPI_|ompi_|opal_)')
  if [ -n "$need$syms" ]; then
    echo "unlinked_mpi: FAILED: $f links OpenMPI:"
    echo "$need$syms" | head -5
    rc=1
  else
    echo "unlinked_mpi: $f: no OpenMPI linked"
  fi
done
exit $rc
