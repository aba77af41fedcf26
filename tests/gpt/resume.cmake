# tests/gpt/resume.cmake — exact resume of ferry-gpt train --engine: 10 steps
# straight equal 5 steps with --save-every 5, then a new process with
# --resume for steps 6..10: the per-step losses (printed %.9g, compared as
# text) and the final model.safetensors bit for bit, with resident.cfg and
# offload-nvme.cfg, and a resident checkpoint resumed on NVMe. --keep K
# leaves the newest K. Refusals: another --seq (exit 2, naming seq), a folder
# that does not exist, a damaged trainer state (exit 1), --resume and
# --save-every without --engine (exit 2).
# -DEXE=ferry-gpt -DDATA=file -DCONFIGS=examples/configs. Runs in a scratch
# directory (offload-nvme.cfg's relative build/nvme-swap is made there).
set(_args train --model tiny --data ${DATA} --batch 2 --seq 32 --seed 5 --lr 2e-3 --json)
foreach(_d resident_full resident_split nvme_full nvme_split cross bad neg)
  file(REMOVE_RECURSE ${CMAKE_CURRENT_BINARY_DIR}/${_d})
endforeach()

# run(name expect_rc args...): sets ${name}_out, ${name}_err, ${name}_losses
# (the "step": N, "loss": X pairs as text)
function(run name expect)
  execute_process(COMMAND ${EXE} ${_args} ${ARGN} OUTPUT_VARIABLE _out ERROR_VARIABLE _err
    RESULT_VARIABLE _rc)
  if(expect STREQUAL "ok" AND NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name} (${ARGN}): ferry-gpt exited ${_rc}\n${_err}")
  elseif(NOT expect STREQUAL "ok" AND NOT _rc EQUAL expect)
    message(FATAL_ERROR "${name} (${ARGN}): expected exit ${expect}, got ${_rc}\n${_out}\n${_err}")
  endif()
  string(REGEX MATCHALL "\"step\": [0-9]+, \"loss\": [^,]+" _l "${_out}")
  set(${name}_out "${_out}" PARENT_SCOPE)
  set(${name}_err "${_err}" PARENT_SCOPE)
  set(${name}_losses "${_l}" PARENT_SCOPE)
endfunction()

function(expect_dirs dir)
  file(GLOB _have RELATIVE ${CMAKE_CURRENT_BINARY_DIR}/${dir} ${CMAKE_CURRENT_BINARY_DIR}/${dir}/*)
  list(SORT _have)
  set(_want ${ARGN})
  list(SORT _want)
  if(NOT "${_have}" STREQUAL "${_want}")
    message(FATAL_ERROR "${dir}: holds '${_have}', expected '${_want}'")
  endif()
endfunction()

function(same_file a b)
  file(SHA256 ${CMAKE_CURRENT_BINARY_DIR}/${a} _ha)
  file(SHA256 ${CMAKE_CURRENT_BINARY_DIR}/${b} _hb)
  if(NOT _ha STREQUAL _hb)
    message(FATAL_ERROR "${a} and ${b} differ")
  endif()
endfunction()

# check(straight first second): steps 1..5 of straight = first, 6..10 = second
function(check straight first second)
  list(LENGTH ${straight}_losses _n)
  list(LENGTH ${first}_losses _n1)
  list(LENGTH ${second}_losses _n2)
  if(NOT _n EQUAL 10 OR NOT _n1 EQUAL 5 OR NOT _n2 EQUAL 5)
    message(FATAL_ERROR "expected 10, 5 and 5 steps, got ${_n}, ${_n1}, ${_n2}:\n"
      "${${straight}_out}\n${${first}_out}\n${${second}_out}")
  endif()
  list(SUBLIST ${straight}_losses 0 5 _a)
  list(SUBLIST ${straight}_losses 5 5 _b)
  if(NOT "${_a}" STREQUAL "${${first}_losses}")
    message(FATAL_ERROR "steps 1..5 differ:\n  ${straight}: ${_a}\n  ${first}: ${${first}_losses}")
  endif()
  if(NOT "${_b}" STREQUAL "${${second}_losses}")
    message(FATAL_ERROR "steps 6..10 differ after --resume:\n  ${straight}: ${_b}\n"
      "  ${second}: ${${second}_losses}")
  endif()
  if(NOT ${second}_err MATCHES "resumed [^\n]*step-000000000005: 5 steps done, continuing at step 6 of 10")
    message(FATAL_ERROR "${second}: no 'resumed ... step 6' line:\n${${second}_err}")
  endif()
  message(STATUS "${second}: steps 6..10 as straight: ${_b}")
endfunction()

set(_ck step-000000000005 step-000000000010)
foreach(cfg resident nvme)
  if(cfg STREQUAL "resident")
    set(_eng --engine ${CONFIGS}/resident.cfg)
    # checkpoints along the way change nothing; --keep 2 leaves steps 6 and 9
    set(_extra --save-every 3 --keep 2)
  else()
    set(_eng --engine ${CONFIGS}/offload-nvme.cfg)
    set(_extra)
  endif()
  run(${cfg}_straight ok ${_eng} --steps 10 --save ${cfg}_full ${_extra})
  run(${cfg}_first ok ${_eng} --steps 5 --save ${cfg}_split --save-every 5)
  expect_dirs(${cfg}_split/checkpoints step-000000000005)
  run(${cfg}_second ok ${_eng} --steps 10 --save ${cfg}_split --save-every 5
    --resume ${cfg}_split)
  check(${cfg}_straight ${cfg}_first ${cfg}_second)
  same_file(${cfg}_full/model.safetensors ${cfg}_split/model.safetensors)
  expect_dirs(${cfg}_split/checkpoints ${_ck})
endforeach()
expect_dirs(resident_full/checkpoints step-000000000006 step-000000000009)
same_file(resident_full/model.safetensors nvme_full/model.safetensors)

# the placement may change between save and resume: resident's step 5 on NVMe
run(cross ok --engine ${CONFIGS}/offload-nvme.cfg --steps 10 --save cross
  --resume resident_split/checkpoints/step-000000000005)
check(nvme_straight nvme_first cross)
same_file(nvme_full/model.safetensors cross/model.safetensors)

# refusals
run(other_seq 2 --engine ${CONFIGS}/resident.cfg --steps 10 --seq 16 --resume resident_split)
if(NOT other_seq_err MATCHES "--seq: checkpoint 32, this run 16")
  message(FATAL_ERROR "another --seq: the message does not name seq:\n${other_seq_err}")
endif()
run(missing 1 --engine ${CONFIGS}/resident.cfg --steps 10 --resume no-such-folder)
if(NOT missing_err MATCHES "no-such-folder: No such file or directory")
  message(FATAL_ERROR "a missing folder: unclear message:\n${missing_err}")
endif()
file(COPY ${CMAKE_CURRENT_BINARY_DIR}/resident_split/checkpoints/step-000000000005
  DESTINATION ${CMAKE_CURRENT_BINARY_DIR}/bad)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/bad/step-000000000005/user.bin "not a trainer state")
run(damaged 1 --engine ${CONFIGS}/resident.cfg --steps 10 --resume bad)
if(NOT damaged_err MATCHES "user.bin")
  message(FATAL_ERROR "a damaged trainer state: unclear message:\n${damaged_err}")
endif()
run(no_engine 2 --steps 10 --resume resident_split)
run(no_engine_save 2 --steps 10 --save neg --save-every 2)
if(NOT no_engine_err MATCHES "need --engine" OR NOT no_engine_save_err MATCHES "need --engine")
  message(FATAL_ERROR "without --engine: unclear message:\n${no_engine_err}\n${no_engine_save_err}")
endif()
message(STATUS "refusals: other --seq, missing folder, damaged state, no --engine")
