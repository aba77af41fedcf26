# tests/gpt/wording.cmake — issue 25 item 15, ferry-gpt's wording: --resume
# with --steps below the checkpoint's step is refused (exit 2, naming both
# steps; it exited 0 with "done: 0 steps (6..3)"), --steps equal to it says
# there is nothing to do (exit 0); sizes print in binary units only (MiB,
# GiB, as the engine's messages), never MB / GB, in the pre-engine and the
# engine runs' progress and closing lines.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs; runs in a scratch dir.
set(_args train --model tiny --data ${DATA} --batch 2 --seq 16 --seed 6)
file(REMOVE_RECURSE ${CMAKE_CURRENT_BINARY_DIR}/w_run)
include(${CMAKE_CURRENT_LIST_DIR}/issue25_run.cmake)
run(plain 0 --steps 2)
run(engine 0 --steps 3 --engine ${CONFIGS}/resident.cfg --save w_run --save-every 3)
foreach(_r plain engine)
  if(${_r}_all MATCHES "[0-9] [MG]B[ ,;)\n]" OR NOT ${_r}_all MATCHES "[0-9] MiB")
    message(FATAL_ERROR "${_r}: decimal units (MB, GB) among binary ones:\n${${_r}_all}")
  endif()
endforeach()
run(below 2 --steps 2 --engine ${CONFIGS}/resident.cfg --resume w_run)
if(NOT below_all MATCHES "the checkpoint is at step 3, past --steps 2: nothing to resume")
  message(FATAL_ERROR "--resume with --steps below the checkpoint: unclear:\n${below_all}")
endif()
run(equal 0 --steps 3 --engine ${CONFIGS}/resident.cfg --resume w_run)
if(NOT equal_all MATCHES "nothing to do: the checkpoint is at step 3 = --steps 3" OR
   equal_all MATCHES "done: 0 steps")
  message(FATAL_ERROR "--resume with --steps at the checkpoint: unclear:\n${equal_all}")
endif()
message(STATUS "binary units only; --steps below / at the checkpoint named")
