# tests/gpt/swap_size.cmake — the NVMe swap files hold the data: a Llama
# whose embedding and head (4096 x 128) dwarf every other tensor, through
# zero-infinity.cfg with 256 KiB chunks (a slot each as large as the largest
# chunk made the files 10x the data), keeping its files: their size on disk
# is the engine's nvme_file_bytes and at most 1.05 x the chunks' bytes, and
# the losses equal those of the same run with params and optimizer state in
# the host tier (every chunk went to NVMe and back); a tiers.nvme.budget
# below the files is refused at finalize, naming the bytes.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs. Runs in a scratch
# directory (zero-infinity.cfg's relative build/nvme-swap is made there).
# With -DMODEL=config.json (TinyLlama's: gpt.cli.swap_size.full, label slow) the
# files of that model at 64 MiB chunks, set up with no step (15 GB written):
# no losses, no read-back.
file(WRITE big-vocab.json "{\"model_type\": \"llama\", \"vocab_size\": 4096, \"hidden_size\": 128,
 \"num_hidden_layers\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,
 \"intermediate_size\": 344, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05,
 \"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false}\n")
file(REMOVE_RECURSE build/nvme-swap)
set(_args train --model big-vocab.json --data ${DATA} --steps 3 --batch 2 --seq 32 --seed 5
    --lr 2e-3 --json --engine ${CONFIGS}/zero-infinity.cfg --set chunk_size=256K)
set(_host 24M)
if(DEFINED MODEL)
  set(_args train --model ${MODEL} --data ${DATA} --steps 0 --batch 1 --seq 128 --engine
      ${CONFIGS}/zero-infinity.cfg --set chunk_size=64M --set tiers.gpu.budget=2G)
  set(_host 2G)
endif()
function(run name)
  execute_process(COMMAND ${EXE} ${_args} ${ARGN} OUTPUT_VARIABLE _out ERROR_VARIABLE _err
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name}: ferry-gpt exited ${_rc}\n${_err}")
  endif()
  string(REGEX MATCHALL "\"loss\": [0-9.]+" _l "${_out}")
  list(LENGTH _l _n)
  if(NOT _n EQUAL 3 AND NOT DEFINED MODEL)
    message(FATAL_ERROR "${name}: expected 3 steps:\n${_out}")
  endif()
  set(${name} "${_l}" PARENT_SCOPE)
  message(STATUS "${name}: ${_l}")
endfunction()
run(nvme --set tiers.host.budget=${_host} --set tiers.nvme.keep_files=true
    --stats-json stats.json)
if(NOT DEFINED MODEL)
  run(host --set tiers.host.budget=300M --set placement.params=host
      --set placement.optimizer=host)
endif()
if(NOT "${nvme}" STREQUAL "${host}" AND NOT DEFINED MODEL)
  message(FATAL_ERROR "losses differ:\n  nvme: ${nvme}\n  host: ${host}")
endif()
file(READ stats.json _j)
string(JSON _file GET "${_j}" nvme_file_bytes)
string(JSON _data GET "${_j}" nvme_data_bytes)
string(JSON _read GET "${_j}" nvme_read_bytes optimizer)
file(GLOB _swaps build/nvme-swap/*.swap)
set(_disk 0)
foreach(f ${_swaps})
  file(SIZE ${f} _s)
  math(EXPR _disk "${_disk} + ${_s}")
endforeach()
math(EXPR _limit "${_data} + ${_data} / 20")
message(STATUS "swap files ${_disk} bytes on disk (engine: ${_file}) for ${_data} of data")
if(DEFINED MODEL)
  set(_read 1) # no step: nothing to read back
endif()
if(NOT _disk EQUAL _file OR _data LESS 70000000 OR _disk GREATER _limit OR _read EQUAL 0)
  message(FATAL_ERROR "swap files ${_disk} bytes (engine: ${_file}), data ${_data}: not within "
    "1.05 x the data (${_limit}), or nothing read back (${_read})")
endif()
file(REMOVE_RECURSE build/nvme-swap) # the kept files (100 MB; 1.1B: 15 GB)
# a tiers.nvme.budget one byte short of the files: finalize refuses it, naming the bytes
math(EXPR _short "${_file} - 1")
execute_process(COMMAND ${EXE} ${_args} --set tiers.host.budget=${_host} --set tiers.nvme.budget=${_short}
  OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(_rc EQUAL 0 OR NOT _err MATCHES "nvme tier need [^(]*\\(${_file} bytes in swap files: ${_data} bytes of chunks"
   OR NOT _err MATCHES "budget of [^(]*\\(${_short} bytes\\)")
  message(FATAL_ERROR "a budget of ${_short} bytes: exit ${_rc}, expected a refusal naming "
    "${_file} and ${_data} bytes:\n${_err}")
endif()
