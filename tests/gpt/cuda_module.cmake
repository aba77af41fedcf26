# tests/gpt/cuda_module.cmake — --device cuda without a loadable CUDA model
# module: exit 1 and one message naming the path tried and why (dlerror, or
# the missing entry symbol), through the loader's override variable
# FERRY_GPT_CUDA_MODULE. Without CUDA in the build: exit 1, "this build has
# no CUDA". -DEXE=ferry-gpt -DDATA=file -DCUDA=ON|OFF -DNOT_A_MODULE=a .so
# without the entry (libferry.so)
set(_args train --model tiny --data ${DATA} --steps 1 --batch 1 --seq 8 --device cuda)
function(expect_refusal module pattern)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env FERRY_GPT_CUDA_MODULE=${module} ${EXE} ${_args}
    OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 1 OR NOT _err MATCHES "${pattern}")
    message(FATAL_ERROR "FERRY_GPT_CUDA_MODULE=${module}: exit ${_rc}, expected 1 and "
      "/${pattern}/:\n${_err}")
  endif()
  message(STATUS "refused: ${_err}")
endfunction()
if(NOT CUDA)
  expect_refusal(/nonexistent "this build has no CUDA")
  return()
endif()
set(_missing /nonexistent/dir/libferry-gpt-cuda.so)
expect_refusal(${_missing}
  "cannot load the CUDA model: ${_missing}: [^\n]*No such file or directory")
expect_refusal(${NOT_A_MODULE} "cannot load the CUDA model: [^\n]*: no gpt_cuda_module_api")
