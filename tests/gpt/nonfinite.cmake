# tests/gpt/nonfinite.cmake — issue 25 item 5: NaN weights (one element of
# wte.weight, tests/gpt/st_edit.py) make every loss NaN. The run stops
# at step 1 with exit 1 naming the step, pre-engine and on the engine (bf16:
# the engine skips the step but no loss scaling recovers from it); --json
# prints "loss": null and an "error" field, never nan; with fp16 dynamic
# loss scaling the skipped steps go on while the scale backs off, 16 in a
# row at most (exit 1 at step 17). Before: -nan printed, exit 0.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs -DFIX=tests/fixtures/gpt
# -DPY=python3 -DTOOL=tests/gpt/st_edit.py; runs in a scratch dir.
set(_w ${CMAKE_CURRENT_BINARY_DIR}/nan_w)
file(REMOVE_RECURSE ${_w})
file(MAKE_DIRECTORY ${_w})
file(COPY ${FIX}/gpt2/config.json DESTINATION ${_w})
execute_process(COMMAND ${PY} ${TOOL} ${FIX}/gpt2/model.safetensors ${_w}/model.safetensors
  --nan wte.weight RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "st_edit.py failed")
endif()
set(_args train --model ${_w}/config.json --weights ${_w} --data ${DATA} --batch 2 --seq 16 --json)
include(${CMAKE_CURRENT_LIST_DIR}/issue25_run.cmake)
function(expect_stop name step)
  if(${name}_out MATCHES "[:\\[,] *-?(nan|inf)")
    message(FATAL_ERROR "${name}: a JSON value nan/inf printed:\n${${name}_out}")
  endif()
  if(NOT ${name}_out MATCHES "\"step\": ${step}, \"loss\": null, [^\n]*\"error\": \"step ${step}: the loss is NaN")
    message(FATAL_ERROR "${name}: no null loss with an error at step ${step}:\n${${name}_out}")
  endif()
  if(NOT ${name}_err MATCHES "step ${step}: the loss is NaN \\(not finite\\)" OR
     ${name}_out MATCHES "\"final\": true")
    message(FATAL_ERROR "${name}: stderr does not name step ${step}, or a final object:\n${${name}_all}")
  endif()
endfunction()
run(pre 1 --steps 3)
expect_stop(pre 1)
run(engine 1 --steps 3 --engine ${CONFIGS}/resident.cfg --save nan_out --save-every 1)
expect_stop(engine 1)
if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/nan_out/checkpoints/step-000000000001)
  message(FATAL_ERROR "a checkpoint was written after a NaN step")
endif()
run(fp16 1 --steps 30 --engine ${CONFIGS}/resident.cfg --set precision.params=fp16)
expect_stop(fp16 17)
if(NOT fp16_out MATCHES "\"step\": 16, \"loss\": null, [^\n]*\"skipped\": true}")
  message(FATAL_ERROR "fp16: step 16 not reported as skipped:\n${fp16_out}")
endif()
message(STATUS "NaN losses stop the run (pre-engine, bf16 step 1; fp16 after 16 skipped steps)")
