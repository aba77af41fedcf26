# tests/gpt/same_losses.cmake — ferry-gpt train twice with one seed, and once
# more with --checkpoint: the per-step losses must be the same text (the
# pre-engine path is deterministic; recomputing blocks changes nothing).
# -DEXE=ferry-gpt -DDATA=file
set(_args train --model llama-tiny --data ${DATA} --steps 3 --batch 2 --seq 32 --seed 9 --json)
foreach(run a b c)
  set(_extra)
  if(run STREQUAL "c")
    set(_extra --checkpoint)
  endif()
  execute_process(COMMAND ${EXE} ${_args} ${_extra} OUTPUT_VARIABLE _out RESULT_VARIABLE _rc
    ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "run ${run}: ferry-gpt exited ${_rc}")
  endif()
  string(REGEX MATCHALL "\"loss\": [0-9.]+" _losses_${run} "${_out}")
endforeach()
list(LENGTH _losses_a _n)
if(NOT _n EQUAL 3 OR NOT "${_losses_a}" STREQUAL "${_losses_b}" OR
   NOT "${_losses_a}" STREQUAL "${_losses_c}")
  message(FATAL_ERROR "losses differ: ${_losses_a} | ${_losses_b} | ${_losses_c}")
endif()
message(STATUS "same losses: ${_losses_a}")
