# cmake/ferry_part.cmake — the folder rules, enforced by the build.
#
# ferry_part(NAME [USES part...]) follows add_library(ferry_NAME OBJECT ...)
# in a folder's CMakeLists.txt. The part's sources get one private include
# directory, build/parts/NAME, holding a link to the part's own folder and
# to each part it declares; the repository root is not on their include
# path. So `#include "nvme/nvme.h"` in a part that does not declare nvme
# fails to compile. The declarations are written to build/parts/rules.txt,
# which the test build.layers checks the object files against (no circle of
# calls between files, no call into an undeclared part).
function(ferry_part name)
  cmake_parse_arguments(P "" "" "USES" ${ARGN})
  set(dir ${CMAKE_BINARY_DIR}/parts/${name})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  foreach(u ${name} ${P_USES})
    if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${u})
      message(FATAL_ERROR "ferry_part(${name}): USES names '${u}', which is not a folder")
    endif()
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${u} ${dir}/${u} SYMBOLIC)
  endforeach()
  target_include_directories(ferry_${name} PRIVATE ${dir})
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
