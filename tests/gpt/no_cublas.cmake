# tests/gpt/no_cublas.cmake — a CPU run of ferry-gpt maps no cuBLAS: the
# dynamic loader's own record (LD_DEBUG=libs: every library it loads,
# dlopen()ed ones too) of a pre-engine run and of an engine run on the host
# backend names OpenBLAS (the record is read) and neither libcublas nor
# libcublasLt, nor the CUDA model's module. With CUDA in the build,
# --device cuda does open the module and cuBLAS (GPU or not: the module is
# opened before the device is asked), so the check can see them.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs -DCUDA=ON|OFF
set(_args train --model tiny --data ${DATA} --steps 2 --batch 2 --seq 16 --seed 3)
function(libs_of name out)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_DEBUG=libs OPENBLAS_NUM_THREADS=1
    ${EXE} ${_args} ${ARGN} OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  string(REGEX MATCHALL "calling init: [^\n]*" _inits "${_err}")
  set(${out} "${_inits}" PARENT_SCOPE)
  set(${out}_rc ${_rc} PARENT_SCOPE)
endfunction()
foreach(run cpu engine)
  if(run STREQUAL "engine")
    libs_of(${run} _libs --engine ${CONFIGS}/resident.cfg)
  else()
    libs_of(${run} _libs)
  endif()
  if(NOT _libs_rc EQUAL 0)
    message(FATAL_ERROR "${run}: ferry-gpt exited ${_libs_rc}")
  endif()
  if(NOT _libs MATCHES "libopenblas")
    message(FATAL_ERROR "${run}: the loader's record names no OpenBLAS, so it says nothing:\n${_libs}")
  endif()
  if(_libs MATCHES "libcublas|libferry-gpt-cuda")
    message(FATAL_ERROR "${run}: a CPU run loaded cuBLAS or the CUDA module:\n${_libs}")
  endif()
  message(STATUS "${run}: no cuBLAS among the libraries loaded")
endforeach()
if(CUDA)
  libs_of(cuda _libs --device cuda)
  if(NOT _libs MATCHES "libferry-gpt-cuda\\.so" OR NOT _libs MATCHES "libcublas\\.so" OR
     NOT _libs MATCHES "libcublasLt\\.so")
    message(FATAL_ERROR "--device cuda (exit ${_libs_rc}): expected the module and cuBLAS "
      "among the libraries loaded:\n${_libs}")
  endif()
  message(STATUS "--device cuda: the module and cuBLAS are loaded (exit ${_libs_rc})")
endif()
