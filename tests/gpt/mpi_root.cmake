# tests/gpt/mpi_root.cmake — running MPI as root: ferry-gpt's message for a
# failed MPI communicator names OpenMPI's fix when it runs as root (and only
# then, and not once the fix is in the environment; the failure comes from
# the test hook FERRY_GPT_TEST_COMM_FAIL), and docs/FERRY-GPT.md's mpirun
# section gives the command that works as root. -DEXE=ferry-gpt -DDATA=file
set(_run train --model tiny --data ${DATA} --steps 1 --batch 1 --seq 16 --comm mpi)
set(_hint "as root, OpenMPI needs `mpirun --allow-run-as-root`, or OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
string(REPLACE "." "\\." _hint_re "${_hint}")
execute_process(COMMAND id -u OUTPUT_VARIABLE _uid OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=OMPI_ALLOW_RUN_AS_ROOT
  --unset=OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "FERRY_GPT_TEST_COMM_FAIL=MPI_Init_thread failed"
  ${EXE} ${_run} OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 1 OR NOT _err MATCHES "--comm mpi: MPI_Init_thread failed")
  message(FATAL_ERROR "a failed MPI communicator: expected exit 1 naming it, got '${_rc}'\n${_err}")
endif()
if(_uid STREQUAL "0" AND NOT _err MATCHES "${_hint_re}")
  message(FATAL_ERROR "as root, the message does not name the fix (${_hint}):\n${_err}")
elseif(NOT _uid STREQUAL "0" AND _err MATCHES "as root")
  message(FATAL_ERROR "not root (uid ${_uid}), yet the message speaks of root:\n${_err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "FERRY_GPT_TEST_COMM_FAIL=MPI_Init_thread failed"
  ${EXE} ${_run} OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 1 OR _err MATCHES "as root")
  message(FATAL_ERROR "with the fix in the environment: exit '${_rc}', still the hint:\n${_err}")
endif()
# the guide: the mpirun section says how to run it as root
get_filename_component(_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
file(READ ${_root}/docs/FERRY-GPT.md _doc)
string(FIND "${_doc}" "## Data parallel (mpirun)" _at)
string(SUBSTRING "${_doc}" ${_at} 1500 _sec)
if(NOT _sec MATCHES "mpirun --allow-run-as-root -np 2" OR
   NOT _sec MATCHES "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  message(FATAL_ERROR "docs/FERRY-GPT.md's mpirun section gives no command for root")
endif()
message(STATUS "uid ${_uid}: the MPI failure's message fits; the guide gives the root command")
