# tests/gpt/tokenize_cli.cmake — `ferry-gpt tokenize`: text on stdin to the
# ids Hugging Face `tokenizers` gives (tests/fixtures/tokenizers, bos from
# the post_processor included), a tokenizer.json file or its folder, and
# --decode back to the text; bad usage exits 2. -DEXE=ferry-gpt -DFIX=folder
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tokenize_in.txt "<s>hello</s> and <unk> tokens")
set(_in ${CMAKE_CURRENT_BINARY_DIR}/tokenize_in.txt)
foreach(_case
    "${FIX}/sp_metaspace|[1, 1, 900, 2, 405, 353, 0, 393, 711, 319]"
    "${FIX}/gpt2/tokenizer.json|[28, 83, 30, 258, 372, 79, 28, 15, 83, 30, 292, 221, 28, 85, 78, 75, 30, 279, 580, 83]")
  string(REPLACE "|" ";" _c "${_case}")
  list(GET _c 0 _tok)
  list(GET _c 1 _want)
  execute_process(COMMAND ${EXE} tokenize --tokenizer ${_tok} INPUT_FILE ${_in}
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 20)
  if(NOT _rc EQUAL 0 OR NOT _out STREQUAL "${_want}\n")
    message(FATAL_ERROR "tokenize ${_tok}: exit ${_rc}, '${_out}' (want '${_want}'):\n${_err}")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tokenize_ids.json "${_out}")
  execute_process(COMMAND ${EXE} tokenize --tokenizer ${_tok} --decode
    INPUT_FILE ${CMAKE_CURRENT_BINARY_DIR}/tokenize_ids.json
    OUTPUT_VARIABLE _back ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 20)
  file(READ ${_in} _text)
  if(NOT _rc EQUAL 0 OR NOT (_back STREQUAL _text OR _back STREQUAL "<s>${_text}"))
    message(FATAL_ERROR "tokenize --decode ${_tok}: exit ${_rc}, '${_back}':\n${_err}")
  endif()
endforeach()
execute_process(COMMAND ${EXE} tokenize --tokenizer ${FIX}/gpt2 --skip-special INPUT_FILE ${_in}
  OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 20)
if(NOT _rc EQUAL 2 OR NOT _err MATCHES "--skip-special needs --decode")
  message(FATAL_ERROR "--skip-special without --decode: exit ${_rc}:\n${_err}")
endif()
execute_process(COMMAND ${EXE} tokenize --tokenizer ${FIX}/gpt2 --decode INPUT_FILE ${_in}
  OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 20)
if(NOT _rc EQUAL 1 OR NOT _err MATCHES "not one JSON list of ids")
  message(FATAL_ERROR "--decode of text: exit ${_rc}:\n${_err}")
endif()
message(STATUS "tokenize: the ids of tokenizers, and back")
