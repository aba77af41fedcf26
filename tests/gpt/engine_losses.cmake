# tests/gpt/engine_losses.cmake — ferry-gpt train --engine on the host
# backend: one seed gives bit-identical per-step losses with resident.cfg,
# offload-host.cfg and offload-nvme.cfg (bf16), and again across placements
# with fp32 params and with 2 micro-batches per step; fp16 runs; the losses fall;
# the same for llama-tiny, with params at home on the host, int8 states and a
# bf16 master.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs. Runs in a scratch
# directory (offload-nvme.cfg's relative build/nvme-swap is made there).
set(_args train --model tiny --data ${DATA} --steps 6 --batch 2 --seq 32 --seed 5 --lr 2e-3
    --json)
function(run name cfg)
  execute_process(COMMAND ${EXE} ${_args} --engine ${CONFIGS}/${cfg}.cfg ${ARGN}
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name} (${cfg} ${ARGN}): ferry-gpt exited ${_rc}\n${_err}")
  endif()
  string(REGEX MATCHALL "\"loss\": [0-9.]+" _l "${_out}")
  list(LENGTH _l _n)
  if(NOT _n EQUAL 6 OR NOT _out MATCHES "\"final\": true")
    message(FATAL_ERROR "${name}: expected 6 steps and a final object:\n${_out}")
  endif()
  list(GET _l 0 _first)
  list(GET _l 5 _last)
  string(REGEX REPLACE "\"loss\": " "" _first "${_first}")
  string(REGEX REPLACE "\"loss\": " "" _last "${_last}")
  if(NOT _last LESS _first)
    message(FATAL_ERROR "${name}: the loss did not fall: ${_l}")
  endif()
  set(${name} "${_l}" PARENT_SCOPE)
  message(STATUS "${name}: ${_l}")
endfunction()
function(same a b)
  if(NOT "${${a}}" STREQUAL "${${b}}")
    message(FATAL_ERROR "losses differ:\n  ${a}: ${${a}}\n  ${b}: ${${b}}")
  endif()
endfunction()

run(bf16_resident resident)
run(bf16_host offload-host)
run(bf16_nvme offload-nvme)
same(bf16_resident bf16_host)
same(bf16_resident bf16_nvme)
run(fp32_resident resident --set precision.params=fp32)
run(fp32_nvme offload-nvme --set precision.params=fp32)
same(fp32_resident fp32_nvme)
run(accum_resident resident --set grad_accumulation=2)
run(accum_nvme offload-nvme --set grad_accumulation=2)
same(accum_resident accum_nvme)
run(fp16_host offload-host --set precision.params=fp16)
# llama-shaped (RMSNorm, SwiGLU, grouped KV heads, an untied head): params
# streamed from their home on the host (zero3-offload) or NVMe equal the
# resident run, also with the step during backward and with int8 states
# and a bf16 master
set(_args train --model llama-tiny --data ${DATA} --steps 6 --batch 2 --seq 32 --seed 5 --lr 2e-3
    --json)
run(llama_resident resident)
run(llama_zero3 offload-host --set placement.params=host)
run(llama_nvme offload-nvme)
same(llama_resident llama_zero3)
same(llama_resident llama_nvme)
run(llama_eager_resident resident --set clip_grad_norm=0)
run(llama_eager_zero3 offload-host --set placement.params=host --set clip_grad_norm=0)
same(llama_eager_resident llama_eager_zero3)
run(llama_int8_zero3 offload-host --set placement.params=host --set optimizer.state_dtype=int8
    --set precision.master=bf16 --set clip_grad_norm=0)
run(llama_int8_eager_resident resident --set optimizer.state_dtype=int8 --set precision.master=bf16
    --set clip_grad_norm=0)
same(llama_int8_eager_resident llama_int8_zero3)
