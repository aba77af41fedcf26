# tests/gpt/log_level.cmake — issue 25 item 9: ferry-gpt installs the
# library's logger, warnings by default, so an engine warning shows: a swap
# directory whose file system refuses O_DIRECT (FERRY_FAULT_REFUSE_ODIRECT,
# the probe's fault-injection hook) names the buffered-I/O fallback on
# stderr (nothing was shown before). --log-level silent hides it; the
# config's log_level = "info" (--set) shows info lines; a bad --log-level is
# exit 2. -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs (scratch dir).
set(_sw ${CMAKE_CURRENT_BINARY_DIR}/log_swap)
file(REMOVE_RECURSE ${_sw})
set(_args train --model tiny --data ${DATA} --batch 2 --seq 16 --steps 1
  --engine ${CONFIGS}/offload-nvme.cfg --set tiers.nvme.paths=${_sw})
function(run name expect)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env FERRY_FAULT_REFUSE_ODIRECT=1 ${EXE} ${_args}
    ${ARGN} OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL expect)
    message(FATAL_ERROR "${name} (${ARGN}): expected exit ${expect}, got ${_rc}\n${_err}")
  endif()
  set(${name}_err "${_err}" PARENT_SCOPE)
endfunction()
run(default 0)
if(NOT default_err MATCHES "ferry: warning: swap 'engine': O_DIRECT refused by [^\n]*buffered I/O")
  message(FATAL_ERROR "the buffered-I/O fallback was not shown (a build without "
    "FERRY_FAULT_INJECTION cannot run this test):\n${default_err}")
endif()
run(silent 0 --log-level silent)
if(silent_err MATCHES "ferry: warning")
  message(FATAL_ERROR "--log-level silent: a warning shown:\n${silent_err}")
endif()
run(info 0 --set log_level=info)
if(NOT info_err MATCHES "ferry: info: ")
  message(FATAL_ERROR "log_level = info: no info line:\n${info_err}")
endif()
run(bad 2 --log-level loud)
if(NOT bad_err MATCHES "--log-level is silent, error, warn, info or debug, not 'loud'")
  message(FATAL_ERROR "--log-level loud: unclear:\n${bad_err}")
endif()
message(STATUS "engine warnings shown by default; --log-level and log_level honoured")
