# tests/gpt/data_special.cmake — issue 25 item 13: --data /dev/zero (a
# stream that never ends) is refused at once, naming the file and
# --data-stream (it grew by ~1 GB/s until out of memory before); with
# --data-stream a pipe is read to its end and trains. A folder is named as
# one. -DEXE=ferry-gpt -DDATA=file
set(_args train --model tiny --steps 1 --batch 2 --seq 16 --seed 2)
execute_process(COMMAND ${EXE} ${_args} --data /dev/zero OUTPUT_QUIET ERROR_VARIABLE _err
  RESULT_VARIABLE _rc TIMEOUT 20)
if(NOT _rc EQUAL 1 OR NOT _err MATCHES "/dev/zero: not a regular file \\(a character device\\).*--data-stream")
  message(FATAL_ERROR "--data /dev/zero: expected exit 1 refusing it, got '${_rc}':\n${_err}")
endif()
execute_process(COMMAND ${EXE} ${_args} --data ${CMAKE_CURRENT_LIST_DIR} OUTPUT_QUIET
  ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 20)
if(NOT _rc EQUAL 1 OR NOT _err MATCHES "a folder, not a data file")
  message(FATAL_ERROR "--data FOLDER: expected exit 1 naming it, got '${_rc}':\n${_err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E cat ${DATA}
  COMMAND ${EXE} ${_args} --data /dev/stdin --data-stream --json
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 30)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "\"final\": true")
  message(FATAL_ERROR "--data-stream over a pipe: exit '${_rc}':\n${_out}\n${_err}")
endif()
message(STATUS "/dev/zero refused at once; a pipe with --data-stream trains")
