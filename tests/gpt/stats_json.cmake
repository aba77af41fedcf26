# tests/gpt/stats_json.cmake — the footprint of `ferry-gpt train`: with
# --engine offload-nvme.cfg (optimizer state on NVMe), --stats-json holds
# every key, the losses the --json steps print, tier peaks within budgets, a
# peak RSS no smaller than the trainer's own buffers, NVMe writes of the
# optimizer family whose setup + per-step sum is the total, and stderr the
# "memory:" (with the optimizer's bytes per param and step) and "nvme" lines; without --engine, the resident bytes (16 per
# parameter) and zeros for the engine's keys.
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs. Runs in a scratch
# directory (offload-nvme.cfg's relative build/nvme-swap is made there).
execute_process(COMMAND ${EXE} train --model tiny --data ${DATA} --steps 3 --batch 2 --seq 32
  --seed 5 --json --engine ${CONFIGS}/offload-nvme.cfg --set tiers.host.budget=20M
  --stats-json stats.json OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "ferry-gpt exited ${_rc}:\n${_err}")
endif()
file(READ stats.json _j)
macro(get var)
  string(JSON ${var} ERROR_VARIABLE _jerr GET "${_j}" ${ARGN})
  if(_jerr)
    message(FATAL_ERROR "stats.json: ${ARGN}: ${_jerr}\n${_j}")
  endif()
endmacro()
get(_steps steps)
string(JSON _nl LENGTH "${_j}" losses)
if(NOT _steps EQUAL 3 OR NOT _nl EQUAL 3)
  message(FATAL_ERROR "expected 3 steps and 3 losses:\n${_j}")
endif()
# the losses: the very text of the --json lines (%.9g both; read from the
# file's text, as string(JSON) reformats numbers)
string(REGEX MATCHALL "\"loss\": [0-9.]+" _printed "${_out}")
string(REGEX REPLACE "\"loss\": " "" _printed "${_printed}")
string(REPLACE ";" ", " _printed "${_printed}")
if(NOT _j MATCHES "\"losses\": \\[${_printed}\\]")
  message(FATAL_ERROR "losses: --json printed [${_printed}]:\n${_j}")
endif()
get(_rss peak_rss_bytes)
get(_act activation_bytes)
get(_scr scratch_bytes)
get(_dat data_bytes)
math(EXPR _own "${_act} + ${_scr} + ${_dat}")
if(_act LESS_EQUAL 0 OR _scr LESS_EQUAL 0 OR _rss LESS ${_own})
  message(FATAL_ERROR "peak RSS ${_rss} below the trainer's own ${_own} bytes, or no "
    "activations / scratch:\n${_j}")
endif()
foreach(t gpu host)
  get(_p tier_peak ${t})
  get(_b budget ${t})
  if(_p LESS_EQUAL 0 OR _p GREATER _b)
    message(FATAL_ERROR "tier ${t}: peak ${_p} not within (0, ${_b}]")
  endif()
endforeach()
get(_wt nvme_write_bytes optimizer)
get(_ws nvme_setup_write_bytes optimizer)
get(_wp nvme_write_bytes_per_step optimizer)
# the --json steps' own nvme_write_bytes add up to total - setup
# (a step line counts the writes completed when it prints: the last step's
# write-back may still be in flight then, and the total has it; so the
# lines sum to the total less at most one step line's worth)
set(_sum 0)
set(_max 0)
string(REGEX MATCHALL "\"step\": [0-9]+[^\n]*\"nvme_write_bytes\": {[^}]*\"optimizer\": [0-9]+" _lines "${_out}")
foreach(_line IN LISTS _lines)
  string(REGEX REPLACE ".*\"optimizer\": ([0-9]+)$" "\\1" _v "${_line}")
  math(EXPR _sum "${_sum} + ${_v}")
  if(_v GREATER _max)
    set(_max ${_v})
  endif()
endforeach()
list(LENGTH _lines _nlines)
math(EXPR _after "${_wt} - ${_ws}")
math(EXPR _mean "${_after} / 3")
math(EXPR _missing "${_after} - ${_sum}")
if(_wt LESS_EQUAL 0 OR NOT _nlines EQUAL 3 OR _missing LESS 0 OR _missing GREATER _max
   OR _max LESS_EQUAL 0 OR NOT _wp EQUAL _mean)
  message(FATAL_ERROR "NVMe optimizer writes: total ${_wt}, setup ${_ws}, per step ${_wp}, "
    "largest step line ${_max}, "
    "${_nlines} step lines summing to ${_sum}:\n${_out}")
endif()
if(NOT _err MATCHES "memory: peak RSS [0-9.]+ [KMG]iB; engine peaks gpu [0-9.]+/[0-9.]+ MiB, host [0-9.]+/[0-9.]+ MiB, nvme [0-9.]+ [KMG]?i?B; optimizer [0-9.e+-]+ B/param/step; trainer activations [0-9.]+ MiB, scratch [0-9.]+ MiB, data"
   OR NOT _err MATCHES "nvme \\(params / grads / optimizer\\): read [^\n]*, written [^\n]*; per step read")
  message(FATAL_ERROR "expected the memory and nvme lines on stderr:\n${_err}")
endif()
# the optimizer pass's bytes per param and step (ferry_stats.optim_bytes_per_param)
string(JSON _obt ERROR_VARIABLE _jerr TYPE "${_j}" optim_bytes_per_param)
get(_obp optim_bytes_per_param)
# offload-nvme.cfg: fp32 grad accumulators (clipping on) read, fp32 master and
# two fp32 states read and written, the bf16 param copy written: 4+8+16+2
if(_jerr OR NOT _obt STREQUAL "NUMBER" OR NOT _obp EQUAL 30)
  message(FATAL_ERROR "optim_bytes_per_param: 30 with --engine offload-nvme.cfg, got "
    "'${_obp}' (${_jerr}):\n${_j}")
endif()
if(NOT _err MATCHES "; optimizer 30 B/param/step; ")
  message(FATAL_ERROR "the memory line lacks '; optimizer 30 B/param/step; ':\n${_err}")
endif()
message(STATUS "engine: ${_j}")

# without --engine
execute_process(COMMAND ${EXE} train --model tiny --data ${DATA} --steps 1 --batch 2 --seq 16
  --stats-json resident.json OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
file(READ resident.json _j)
get(_res resident_bytes)
get(_gp tier_peak gpu)
get(_nw nvme_write_bytes optimizer)
string(JSON _obt TYPE "${_j}" optim_bytes_per_param)
if(NOT _obt STREQUAL "NULL")
  message(FATAL_ERROR "optim_bytes_per_param: null without --engine:\n${_j}")
endif()
if(NOT _rc EQUAL 0 OR _res LESS_EQUAL 0 OR NOT _gp EQUAL 0 OR NOT _nw EQUAL 0 OR
   NOT _out MATCHES "memory: peak RSS [^\n]*; pre-engine weights\\+grads\\+AdamW [0-9.]+ MiB")
  message(FATAL_ERROR "pre-engine (exit ${_rc}):\n${_j}\n${_out}")
endif()
message(STATUS "pre-engine: ${_j}")
