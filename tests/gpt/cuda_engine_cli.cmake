# tests/gpt/cuda_engine_cli.cmake — `ferry-gpt train --device cuda --engine
# offload-nvme.cfg`: the option parser accepts it; without a GPU it fails at
# the engine's device creation with FERRY_ENODEV, the CUDA runtime's own
# message and exit status 1 (not 2, bad usage); with a GPU it runs 2 steps
# and exits 0. -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs. Runs
# in a scratch directory (the config's relative build/nvme-swap).
execute_process(COMMAND ${EXE} train --model tiny --data ${DATA} --steps 2 --batch 2 --seq 16
  --seed 3 --json --device cuda --engine ${CONFIGS}/offload-nvme.cfg
  --set tiers.gpu.budget=256M
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(_rc EQUAL 0)
  string(REGEX MATCHALL "\"step\": [0-9]+, \"loss\": [0-9.]+" _steps "${_out}")
  list(LENGTH _steps _n)
  if(NOT _n EQUAL 2 OR NOT _out MATCHES "\"final\": true")
    message(FATAL_ERROR "expected 2 steps and a final object:\n${_out}\n${_err}")
  endif()
  message(STATUS "ran on a GPU: ${_steps}")
  return()
endif()
if(NOT _rc EQUAL 1)
  message(FATAL_ERROR "exit status ${_rc}, expected 1 (no GPU) or 0:\n${_err}")
endif()
if(NOT _err MATCHES "FERRY_ENODEV" OR NOT _err MATCHES "cuda[A-Za-z]*Error|CUDA")
  message(FATAL_ERROR "expected FERRY_ENODEV and the CUDA runtime's message:\n${_err}")
endif()
if(NOT _err MATCHES "device create")
  message(FATAL_ERROR "expected the failure at the device's creation:\n${_err}")
endif()
execute_process(COMMAND nvidia-smi -L OUTPUT_VARIABLE _gpus ERROR_QUIET RESULT_VARIABLE _smi)
if(_smi EQUAL 0 AND _gpus MATCHES "GPU [0-9]")
  message(FATAL_ERROR "nvidia-smi lists a GPU, yet the engine found no device:\n${_err}")
endif()
message(STATUS "no GPU: refused as expected:\n${_err}")
