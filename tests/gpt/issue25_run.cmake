# tests/gpt/issue25_run.cmake — included by the issue 25 scripts:
# run(name expect args...) runs ${EXE} ${_args} args, fails unless it exits
# `expect`, and sets ${name}_out, ${name}_err and ${name}_all (both).
function(run name expect)
  execute_process(COMMAND ${EXE} ${_args} ${ARGN} OUTPUT_VARIABLE _out ERROR_VARIABLE _err
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL expect)
    message(FATAL_ERROR "${name} (${ARGN}): expected exit ${expect}, got ${_rc}\n${_out}\n${_err}")
  endif()
  set(${name}_out "${_out}" PARENT_SCOPE)
  set(${name}_err "${_err}" PARENT_SCOPE)
  set(${name}_all "${_out}${_err}" PARENT_SCOPE)
endfunction()
