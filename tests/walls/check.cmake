# tests/walls/check.cmake — the test build.walls: builds each probe target
# that tests/walls/CMakeLists.txt wrote to PROBES ("target header expect"
# lines) in the build folder BIN. A `hidden` probe must fail to compile with
# its header not found (gcc: "h: No such file or directory", clang: "'h' file
# not found"); a `seen` probe must compile. Any other outcome fails the test.
# ferry_part() must refuse a *_impl.h in FACE (impl_face/). And no source
# under SRC may climb out of its folder with a quoted include of an absolute
# path or one through "..", which no include path can stop.
file(STRINGS ${PROBES} lines)
set(bad 0)
foreach(line ${lines})
  string(REPLACE " " ";" f "${line}")
  list(GET f 0 target)
  list(GET f 1 header)
  list(GET f 2 expect)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} --target ${target}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REPLACE "." "\\." h "${header}")
  if(expect STREQUAL "seen")
    if(rc EQUAL 0)
      message(STATUS "ok: ${target} compiles with ${header}")
    else()
      message(SEND_ERROR "${target}: ${header} should be seen there, but the build failed:\n${out}")
      set(bad 1)
    endif()
  elseif(rc EQUAL 0)
    message(SEND_ERROR "${target}: ${header} is behind a wall there, yet the probe compiled")
    set(bad 1)
  elseif(out MATCHES "${h}: No such file or directory" OR out MATCHES "'${h}' file not found")
    message(STATUS "ok: ${target} fails: ${header} not found")
  else()
    message(SEND_ERROR "${target}: the build failed, but not on ${header} not found:\n${out}")
    set(bad 1)
  endif()
endforeach()
# ferry_part() refuses a *_impl.h in FACE (impl_face/ lists one).
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC}/tests/walls/impl_face
                -B ${BIN}/tests/walls/impl_face -D FERRY_SOURCE=${SRC}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX REPLACE "[ \n]+" " " flat "${out}")
if(NOT rc EQUAL 0 AND flat MATCHES "memory/mem_impl\\.h is private \\(\\*_impl\\.h\\) and cannot be a FACE")
  message(STATUS "ok: ferry_part() refuses memory/mem_impl.h as a FACE")
else()
  message(SEND_ERROR "ferry_part() took a *_impl.h as a FACE (rc ${rc}):\n${out}")
  set(bad 1)
endif()
file(GLOB tops LIST_DIRECTORIES true RELATIVE ${SRC} ${SRC}/*)
foreach(top ${tops})
  if(NOT IS_DIRECTORY ${SRC}/${top} OR top MATCHES "^(build|\\.)")
    continue()
  endif()
  file(GLOB_RECURSE files ${SRC}/${top}/*.c ${SRC}/${top}/*.h ${SRC}/${top}/*.cu)
  foreach(file ${files})
    file(STRINGS ${file} climbs REGEX "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*\\.\\./|/)")
    if(climbs)
      message(SEND_ERROR "${file}: an include that climbs out of its folder: ${climbs}")
      set(bad 1)
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "build.walls: a wall is open or a face is closed (cmake/README.md)")
endif()
