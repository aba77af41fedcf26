# tests/gpt/ulimit_v.cmake — issue 25 item 10: a CPU run of ferry-gpt under
# `ulimit -v 500000` (RLIMIT_AS, 488 MiB) starts and finishes. Before, the
# library mapped libnccl.so.2 (208 MiB) and libcudart at load in a CUDA
# build, and OpenBLAS's worker threads, refused their 128 MiB GEMM buffers,
# spun at 100% CPU forever. Now NCCL is opened only by an NCCL communicator,
# and ferry-gpt fits OpenBLAS's threads to the limit (a note says so). The
# loader's record of a run (LD_DEBUG=libs) names no libnccl; a limit too
# small for even one buffer (ulimit -v 150000) is refused naming it (exit 1),
# never a spin. -DEXE=ferry-gpt -DDATA=file
set(_run train --model tiny --data ${DATA} --steps 2 --batch 2 --seq 16 --seed 3)
string(REPLACE ";" " " _cmd "${EXE};${_run}")
execute_process(COMMAND sh -c "ulimit -v 500000 && exec ${_cmd}" OUTPUT_VARIABLE _out
  ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "done: 2 steps")
  message(FATAL_ERROR "under ulimit -v 500000: exit '${_rc}' (a timeout: the spin)\n${_out}\n${_err}")
endif()
execute_process(COMMAND sh -c "ulimit -v 150000 && exec ${_cmd}" OUTPUT_QUIET
  ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 1 OR NOT _err MATCHES "out of address space: ulimit -v \\(RLIMIT_AS\\) is 146.5 MiB")
  message(FATAL_ERROR "under ulimit -v 150000: expected exit 1 naming the limit, got '${_rc}'\n${_err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_DEBUG=libs ${EXE} ${_run} OUTPUT_QUIET
  ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 0 OR NOT _err MATCHES "libopenblas" OR _err MATCHES "libnccl")
  message(FATAL_ERROR "a CPU run (exit ${_rc}) loaded NCCL, or the record says nothing:\n${_err}")
endif()
message(STATUS "ulimit -v 500000: trains; 150000: refused; no libnccl loaded")
