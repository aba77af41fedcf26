# cmake/ferry_part.cmake — the walls between folders, enforced by the build
# (cmake/README.md explains them).
#
# ferry_part(NAME [USES part...] [FACE header...] [TEST_FACE header...])
# follows add_library(ferry_NAME OBJECT ...) in a library folder's
# CMakeLists.txt. FACE lists the headers of NAME/ that other parts, the
# programs and the tests may include; TEST_FACE the private headers NAME's own
# tests (tests/NAME/) may include as well. Each list becomes a folder of
# per-file links, build/faces/NAME/NAME/x.h and build/testfaces/NAME/NAME/y.h,
# and only such folders are on include paths:
#   - the part's sources: their own folder (build/parts/NAME/NAME) and the
#     faces of the parts they declare;
#   - programs (cli/, bench/, examples/): include/, their own folder and every
#     face (ferry_program_walls);
#   - tests/X/: include/, every face, the tests' helpers and X's test face
#     (ferry_test_walls).
# The repository root is on no include path, so `#include "nvme/swap_impl.h"`
# outside nvme/ fails to compile (the test build.walls proves it). A header
# reached through a face resolves its own quoted includes through the same
# include path, so a face cannot lead to a private header either. A *_impl.h
# is never a face. The declarations are written to build/parts/rules.txt,
# which the test build.layers checks the object files against (no circle of
# calls between files, no call into an undeclared part).

# The interface target every program and test links for the faces.
if(NOT TARGET ferry_faces)
  add_library(ferry_faces INTERFACE)
endif()

# Makes ${CMAKE_BINARY_DIR}/<kind>/<folder>/<folder>/<h> a link to each
# <folder>/<h> of the source tree; the include root goes to <out>.
function(_ferry_link_headers out kind folder)
  set(root ${CMAKE_BINARY_DIR}/${kind}/${folder})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root}/${folder})
  foreach(h ${ARGN})
    set(src ${PROJECT_SOURCE_DIR}/${folder}/${h})
    if(NOT EXISTS ${src} OR IS_DIRECTORY ${src})
      message(FATAL_ERROR "ferry: ${kind} of ${folder}/ lists '${h}', which is no header there")
    endif()
    get_filename_component(sub ${root}/${folder}/${h} DIRECTORY)
    file(MAKE_DIRECTORY ${sub})
    file(CREATE_LINK ${src} ${root}/${folder}/${h} SYMBOLIC)
  endforeach()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

# ferry_face(FOLDER [FACE header...] [TEST_FACE header...]): the faces of a
# folder, for a library part (through ferry_part) or a program folder whose
# headers others share (bench/). Refuses a *_impl.h in FACE.
function(ferry_face folder)
  cmake_parse_arguments(F "" "" "FACE;TEST_FACE" ${ARGN})
  foreach(h ${F_FACE})
    if(h MATCHES "_impl\\.h$")
      message(FATAL_ERROR "ferry: ${folder}/${h} is private (*_impl.h) and cannot be a FACE; "
                          "list it in TEST_FACE for ${folder}'s own tests, or give the other "
                          "folders a face header that says what they need")
    endif()
  endforeach()
  _ferry_link_headers(root faces ${folder} ${F_FACE})
  target_include_directories(ferry_faces INTERFACE ${root})
  _ferry_link_headers(troot testfaces ${folder} ${F_TEST_FACE})
endfunction()

function(ferry_part name)
  cmake_parse_arguments(P "" "" "USES;FACE;TEST_FACE" ${ARGN})
  set(dir ${CMAKE_BINARY_DIR}/parts/${name})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${name} ${dir}/${name} SYMBOLIC)
  set(inc ${dir})
  foreach(u ${P_USES})
    if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${u} OR u STREQUAL name)
      message(FATAL_ERROR "ferry_part(${name}): USES names '${u}', which is not another folder")
    endif()
    list(APPEND inc ${CMAKE_BINARY_DIR}/faces/${u})
  endforeach()
  ferry_face(${name} FACE ${P_FACE} TEST_FACE ${P_TEST_FACE})
  target_include_directories(ferry_${name} PRIVATE ${inc})
  string(REPLACE ";" " " uses "${P_USES}")
  set_property(GLOBAL APPEND PROPERTY FERRY_PART_RULES "${name}: ${uses}")
  set(FERRY_PARTS ${FERRY_PARTS} ferry_${name} CACHE INTERNAL "")
endfunction()

# Writes build/parts/rules.txt (call once, after every part).
function(ferry_write_part_rules)
  get_property(rules GLOBAL PROPERTY FERRY_PART_RULES)
  string(REPLACE ";" "\n" text "${rules}")
  file(WRITE ${CMAKE_BINARY_DIR}/parts/rules.txt "${text}\n")
endfunction()

# ferry_program_walls(TARGET FOLDER): a program's sources (cli/, bench/)
# see include/ (ferry_flags), their own folder as FOLDER/x.h, and the faces.
function(ferry_program_walls target folder)
  set(dir ${CMAKE_BINARY_DIR}/own/${folder})
  if(NOT EXISTS ${dir}/${folder})
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${dir}/${folder} SYMBOLIC)
  endif()
  target_include_directories(${target} PRIVATE ${dir})
  target_link_libraries(${target} PRIVATE ferry_faces)
endfunction()

# ferry_test_walls(TARGET FOLDER): a test program of tests/FOLDER/ sees
# include/, the faces, the tests' shared helpers (tests/x.h, tests/*/y.h,
# as "tests/..."), and FOLDER's test face when FOLDER is a part.
function(ferry_test_walls target folder)
  set(dir ${CMAKE_BINARY_DIR}/own/tests)
  if(NOT EXISTS ${dir}/tests)
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/tests ${dir}/tests SYMBOLIC)
  endif()
  target_include_directories(${target} PRIVATE ${dir})
  if("ferry_${folder}" IN_LIST FERRY_PARTS)
    target_include_directories(${target} PRIVATE ${CMAKE_BINARY_DIR}/testfaces/${folder})
  endif()
  target_link_libraries(${target} PRIVATE ferry_faces)
endfunction()
