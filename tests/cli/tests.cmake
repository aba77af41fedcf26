# tests/cli/: the planner (`ferry plan`, plan/plan.c) against the engine
# it plans for (docs/PLANNING.md, "What is validated"). Included by
# cli/CMakeLists.txt at the end of the top directory.
ferry_add_test(NAME cli.plan.vs_engine SOURCES ${PROJECT_SOURCE_DIR}/tests/cli/test_plan_engine.c
               EXE test_plan_engine TIMEOUT 120 ARGS ${PROJECT_BINARY_DIR}/tests/cli-scratch)
