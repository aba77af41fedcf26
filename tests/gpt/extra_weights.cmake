# tests/gpt/extra_weights.cmake — issue 25 item 6: tensors of --weights the
# model does not use are named in a warning (they were ignored silently):
# the 2-layer fixture under a 1-layer config (a whole extra block), and
# lm_head.weight beside a tied head (tests/gpt/st_edit.py --add);
# --strict-weights refuses them (exit 1) and accepts an exact file.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs -DFIX=tests/fixtures/gpt
# -DPY=python3 -DTOOL=tests/gpt/st_edit.py; runs in a scratch dir.
set(_w ${CMAKE_CURRENT_BINARY_DIR}/extra_w)
file(REMOVE_RECURSE ${_w})
file(MAKE_DIRECTORY ${_w})
execute_process(COMMAND ${PY} ${TOOL} ${FIX}/gpt2/model.safetensors ${_w}/model.safetensors
  --add lm_head.weight=wte.weight RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "st_edit.py failed")
endif()
file(READ ${FIX}/gpt2/config.json _cfg)
string(REPLACE "\"n_layer\": 2" "\"n_layer\": 1" _one "${_cfg}")
file(WRITE ${_w}/one_layer.json "${_one}")
set(_args train --data ${DATA} --batch 2 --seq 16 --steps 1)
include(${CMAKE_CURRENT_LIST_DIR}/issue25_run.cmake)
run(block 0 --model ${_w}/one_layer.json --weights ${FIX}/gpt2/model.safetensors)
if(NOT block_err MATCHES "warning: --weights [^\n]* holds 12 tensors the model does not use: 'h.1.attn.c_attn.bias'")
  message(FATAL_ERROR "an extra block: no warning naming it:\n${block_err}")
endif()
run(head 0 --model ${FIX}/gpt2/config.json --weights ${_w}/model.safetensors
  --engine ${CONFIGS}/resident.cfg)
if(NOT head_err MATCHES "holds 1 tensor the model does not use: 'lm_head.weight'")
  message(FATAL_ERROR "lm_head.weight with a tied head: no warning naming it:\n${head_err}")
endif()
run(strict 1 --model ${FIX}/gpt2/config.json --weights ${_w}/model.safetensors --strict-weights)
if(NOT strict_err MATCHES "refused \\(--strict-weights\\): [^\n]*'lm_head.weight'")
  message(FATAL_ERROR "--strict-weights: not refused naming the tensor:\n${strict_err}")
endif()
run(exact 0 --model ${FIX}/gpt2/config.json --weights ${FIX}/gpt2/model.safetensors --strict-weights)
if(exact_err MATCHES "does not use")
  message(FATAL_ERROR "an exact file: a warning:\n${exact_err}")
endif()
message(STATUS "unused tensors named; --strict-weights refuses them")
