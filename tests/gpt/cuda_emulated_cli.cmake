# tests/gpt/cuda_emulated_cli.cmake — `ferry-gpt train --device cuda` (the
# pre-engine path: the loader, the module's table, resident weights, grads
# down, AdamW on the host, weights up) on the CUDA model compiled for the
# host (the module libferry-gpt-cuda-emu.so, tests/gpt/cuda_emu/), against
# the same run on the CPU: `tiny` (batch 2 x seq 32) and `llama-tiny`
# (batch 3 x seq 96: two attention tiles, the second ragged), with and
# without --checkpoint, each step's loss within 1e-2 relative of the CPU's.
# -DEXE=ferry-gpt -DDATA=file -DMODULE=the emulated module
function(losses out)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env FERRY_GPT_CUDA_MODULE=${MODULE} ${EXE} ${ARGN}
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "ferry-gpt ${ARGN}: exit ${_rc}\n${_err}")
  endif()
  string(REGEX MATCHALL "\"loss\": [0-9.]+" _l "${_out}")
  string(REGEX REPLACE "\"loss\": " "" _l "${_l}")
  set(${out} "${_l}" PARENT_SCOPE)
endfunction()

# a decimal as an integer count of 1e-6
function(micro out v)
  string(REGEX MATCH "^([0-9]+)\\.?([0-9]*)$" _m "${v}")
  string(SUBSTRING "${CMAKE_MATCH_2}000000" 0 6 _f)
  math(EXPR _r "${CMAKE_MATCH_1} * 1000000 + 1${_f} - 1000000")
  set(${out} ${_r} PARENT_SCOPE)
endfunction()

foreach(run "tiny 2 32" "llama-tiny 3 96")
  separate_arguments(run)
  list(GET run 0 model)
  list(GET run 1 batch)
  list(GET run 2 seq)
  set(_args train --model ${model} --data ${DATA} --steps 3 --batch ${batch} --seq ${seq} --seed 9
    --json)
  losses(_cpu ${_args})
  foreach(ck "" --checkpoint)
    losses(_gpu ${_args} --device cuda ${ck})
    list(LENGTH _cpu _n)
    list(LENGTH _gpu _m)
    if(NOT _n EQUAL 3 OR NOT _m EQUAL 3)
      message(FATAL_ERROR "${model} ${ck}: ${_n} and ${_m} losses")
    endif()
    foreach(i RANGE 2)
      list(GET _cpu ${i} _c)
      list(GET _gpu ${i} _g)
      micro(_ci ${_c})
      micro(_gi ${_g})
      math(EXPR _d "${_gi} - ${_ci}")
      if(_d LESS 0)
        math(EXPR _d "-${_d}")
      endif()
      math(EXPR _lim "${_ci} / 100")
      if(_d GREATER _lim)
        message(FATAL_ERROR "${model} ${ck} step ${i}: cuda ${_g}, cpu ${_c}")
      endif()
    endforeach()
    message(STATUS "${model} ${ck}: cpu ${_cpu} | cuda (emulated) ${_gpu}")
  endforeach()
endforeach()
