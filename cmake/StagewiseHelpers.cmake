# Shared build helpers.

# One precompiled <torch/torch.h>, built once and reused by every target that
# includes LibTorch: on a 2-core machine this is most of the build time.
add_library(stagewise_torch_pch STATIC ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cc)
target_link_libraries(stagewise_torch_pch PUBLIC ${TORCH_LIBRARIES})
if(STAGEWISE_USE_PCH)
  target_precompile_headers(stagewise_torch_pch PRIVATE <torch/torch.h>)
endif()

# stagewise_use_torch(target): link LibTorch and reuse the shared PCH.
function(stagewise_use_torch target)
  target_link_libraries(${target} PUBLIC stagewise_torch_pch)
  if(STAGEWISE_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM stagewise_torch_pch)
  endif()
endfunction()

# stagewise_process_defaults(target): what every stagewise executable (binary,
# test, benchmark) links: the malloc settings applied before main().
function(stagewise_process_defaults target)
  target_link_libraries(${target} PRIVATE stagewise_malloc_tuning)
endfunction()

# stagewise_add_test(NAME n SOURCES ... LIBS ... LABELS ... [TIMEOUT s] [COST c] [TORCH])
# One GoogleTest executable; every test case becomes a ctest test with LABELS
# (and a TIMEOUT in seconds, for the slow suites). COST: a parallel ctest
# without timing data from an earlier run (a fresh CI checkout) starts the
# tests of higher cost first, so give the suites of long tests one, or they
# may start last and run alone at the end.
function(stagewise_add_test)
  cmake_parse_arguments(T "TORCH" "NAME;TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  stagewise_process_defaults(${T_NAME})
  if(T_TORCH)
    stagewise_use_torch(${T_NAME})
  endif()
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${T_NAME} PRIVATE
    STAGEWISE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    STAGEWISE_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(extra)
  if(T_TIMEOUT)
    list(APPEND extra TIMEOUT ${T_TIMEOUT})
  endif()
  if(T_COST)
    list(APPEND extra COST ${T_COST})
  endif()
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" ${extra}
    DISCOVERY_TIMEOUT 60)
endfunction()
