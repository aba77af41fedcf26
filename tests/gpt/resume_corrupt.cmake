# tests/gpt/resume_corrupt.cmake — issue 25 item 11: user.bin is checked
# (its CRC32C against the manifest) before it is parsed. One flipped byte in
# the saved seed (offset 32) read as "the checkpoint was made with other
# settings" (exit 2) before: now exit 1 naming user.bin and the CRC, with no
# settings difference named; one flipped byte in the version field likewise
# (it read as "version 16711681"). -DEXE=ferry-gpt -DDATA=file
# -DCONFIGS=examples/configs -DPY=python3 (scratch dir)
set(_args train --model tiny --data ${DATA} --batch 2 --seq 16 --seed 7
  --engine ${CONFIGS}/resident.cfg)
include(${CMAKE_CURRENT_LIST_DIR}/issue25_run.cmake)
file(REMOVE_RECURSE ${CMAKE_CURRENT_BINARY_DIR}/rc_run)
run(save 0 --steps 2 --save rc_run --save-every 2)
set(_blob ${CMAKE_CURRENT_BINARY_DIR}/rc_run/checkpoints/step-000000000002/user.bin)
file(COPY_FILE ${_blob} ${CMAKE_CURRENT_BINARY_DIR}/rc_user.bin.good)
foreach(_at 32 8)
  file(COPY_FILE ${CMAKE_CURRENT_BINARY_DIR}/rc_user.bin.good ${_blob})
  execute_process(COMMAND ${PY} -c
    "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[${_at}]^=0xff; open(p,'wb').write(b)"
    ${_blob} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "cannot flip a byte of ${_blob}")
  endif()
  run(flip 1 --steps 3 --resume rc_run)
  if(NOT flip_err MATCHES "user.bin: damaged: CRC32C [0-9a-f]+, the manifest says" OR
     NOT flip_err MATCHES "corrupt" OR flip_err MATCHES "other settings|version")
    message(FATAL_ERROR "byte ${_at} of user.bin flipped: not named as corruption:\n${flip_err}")
  endif()
endforeach()
file(COPY_FILE ${CMAKE_CURRENT_BINARY_DIR}/rc_user.bin.good ${_blob})
run(good 0 --steps 3 --resume rc_run)
message(STATUS "a flipped byte of user.bin is corruption (exit 1, CRC named)")
