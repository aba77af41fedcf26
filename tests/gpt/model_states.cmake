# tests/gpt/model_states.cmake — ferry-gpt's "model states" line is the
# engine's homes after finalize (ferry_stats), not a fixed 18 bytes/param:
# each family's bytes in its home tier, grads "none" when the step runs
# during backward, for fp32 states, int8 states and int8 states with the
# bf16 params as the master, with the optimizer in the host tier
# (offload-host.cfg: bf16 params on the device, fp32 grads, the optimizer
# family in host RAM) and on NVMe (zero-infinity.cfg, grads none). The
# families' bytes add up to the total, and the bytes per param are the
# layout's (chunks rounded to pages: within 0.1 of the formula).
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs (scratch dir).
set(_base train --model tiny --data ${DATA} --batch 1 --seq 16 --steps 0)
# name config extra-sets expected-bytes/param expected-families-regex
function(check name cfg want fams)
  execute_process(COMMAND ${EXE} ${_base} --engine ${CONFIGS}/${cfg} ${ARGN}
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name}: ferry-gpt exited ${_rc}\n${_err}")
  endif()
  set(_num "([0-9]+\\.[0-9])")
  if(NOT _out MATCHES "model states ${_num} MiB \\(([0-9.]+) bytes/param\\): params ${_num} MiB on ([a-z]+), grads ([^,]+), optimizer ${_num} MiB on ([a-z]+)\n")
    message(FATAL_ERROR "${name}: no model states line:\n${_out}")
  endif()
  set(_total ${CMAKE_MATCH_1})
  set(_bpp ${CMAKE_MATCH_2})
  set(_line "${CMAKE_MATCH_0}")
  if(NOT _line MATCHES "${fams}")
    message(FATAL_ERROR "${name}: homes not ${fams}:\n${_line}")
  endif()
  string(REGEX MATCHALL "[0-9]+\\.[0-9] MiB on" _parts "${_line}")
  set(_sum 0)
  foreach(p ${_parts})
    string(REGEX REPLACE " MiB on" "" p "${p}")
    string(REPLACE "." "" p "${p}")
    math(EXPR _sum "${_sum} + ${p}")
  endforeach()
  string(REPLACE "." "" _t10 "${_total}")
  math(EXPR _d "${_sum} - ${_t10}")
  if(_d GREATER 2 OR _d LESS -2)
    message(FATAL_ERROR "${name}: the families do not add up to the total:\n${_line}")
  endif()
  if(_bpp LESS ${want} OR _bpp GREATER ${want}.1)
    message(FATAL_ERROR "${name}: ${_bpp} bytes/param, expected ${want} (to 0.1):\n${_line}")
  endif()
  message(STATUS "${name}: ${_line}")
endfunction()
set(_hostfam "params [0-9.]+ MiB on gpu, grads [0-9.]+ MiB on host, optimizer [0-9.]+ MiB on host")
# 2 (bf16 params) + 4 (fp32 grads) + 4 (master) + 2 x 4, 2 x 1.016 (int8), or no master
check(host_fp32 offload-host.cfg 18 "${_hostfam}")
check(host_int8 offload-host.cfg 12 "${_hostfam}" --set optimizer.state_dtype=int8)
check(host_int8_m16 offload-host.cfg 8 "${_hostfam}" --set optimizer.state_dtype=int8
  --set precision.master=bf16)
set(_nvfam "params [0-9.]+ MiB on nvme, grads none, optimizer [0-9.]+ MiB on nvme")
set(_nv --set tiers.nvme.paths=model_states_swap --set tiers.host.budget=64M)
check(nvme_fp32 zero-infinity.cfg 14 "${_nvfam}" ${_nv})
check(nvme_int8 zero-infinity.cfg 8 "${_nvfam}" ${_nv} --set optimizer.state_dtype=int8)
check(nvme_int8_m16 zero-infinity.cfg 4 "${_nvfam}" ${_nv} --set optimizer.state_dtype=int8
  --set precision.master=bf16)
file(REMOVE_RECURSE model_states_swap)
