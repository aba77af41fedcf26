# tests/gpt/save_verify.cmake — `ferry checkpoint verify DIR` and `info DIR`
# take the folder `ferry-gpt train --save DIR` wrote, as `--resume DIR`
# does (its checkpoints/ holds the step-* folders).
# -DEXE=ferry-gpt -DFERRY=ferry -DDATA=file -DCONFIGS=examples/configs; runs in a scratch dir.
file(REMOVE_RECURSE ${CMAKE_CURRENT_BINARY_DIR}/sv_out)
execute_process(COMMAND ${EXE} train --model tiny --data ${DATA} --batch 2 --seq 16 --seed 4
  --steps 2 --engine ${CONFIGS}/resident.cfg --save sv_out --save-every 2
  OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "train --save sv_out --save-every 2: exit ${_rc}\n${_err}")
endif()
execute_process(COMMAND ${FERRY} checkpoint verify sv_out
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "sv_out/checkpoints/step-000000000002: ok \\(step 2,")
  message(FATAL_ERROR "checkpoint verify sv_out: exit ${_rc}\n${_out}${_err}")
endif()
execute_process(COMMAND ${FERRY} checkpoint info sv_out
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "step +2")
  message(FATAL_ERROR "checkpoint info sv_out: exit ${_rc}\n${_out}${_err}")
endif()
message(STATUS "the --save folder verifies and describes: ${_out}")
