# The fidelity acceptance test (tests/oracle/fidelity_test.sh, docs/fidelity.md): every cache type
# converted by `kvsnap convert` into every other, restored by real llama.cpp v0.5.0 and scored
# against natively computed caches. Included at the end of tests/oracle/CMakeLists.txt (so only when
# a bed was found). It needs three targets: kvsnap-oracle-3.22.1 (made above), kvsnap (top level)
# and kvsnap-mkmodel (tests/tools, read after tests/oracle): in the full project the test is
# therefore registered at the end of the top-level directory, like oracle.bed.
#
#   ctest --test-dir build -L fidelity --output-on-failure      (about 2 minutes on 2 cores)
# Every KL is the mean over the last 16 prompt positions (--eval-tail 16, docs/fidelity.md).
function(kvsnap_fidelity_add_test root script work)
  set(missing "")
  foreach(t kvsnap-oracle-3.22.1 kvsnap kvsnap-mkmodel)
    if(NOT TARGET ${t})
      list(APPEND missing ${t})
    endif()
  endforeach()
  if(missing)
    message(STATUS "kvsnap oracle: no fidelity test (missing targets: ${missing})")
    return()
  endif()
  add_test(NAME oracle.fidelity
    COMMAND bash "${script}"
      --kvsnap "$<TARGET_FILE:kvsnap>"
      --driver "$<TARGET_FILE:kvsnap-oracle-3.22.1>"
      --mkmodel "$<TARGET_FILE:kvsnap-mkmodel>"
      --prompt "${root}/fixtures/prompt.txt"
      --work "${work}"
      --eval-tail 16
      --jobs 2)
  # llama.cpp's own allocations are not ours to leak-check under KVSNAP_SANITIZE
  set_tests_properties(oracle.fidelity PROPERTIES
    LABELS "oracle;fidelity" TIMEOUT 1800 PROCESSORS 2 ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  message(STATUS "kvsnap oracle: test oracle.fidelity")
endfunction()

set(_fidelity_args "${KVSNAP_ROOT}" "${CMAKE_CURRENT_LIST_DIR}/fidelity_test.sh" "${CMAKE_CURRENT_BINARY_DIR}/fidelity")
if(CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR)
  kvsnap_fidelity_add_test(${_fidelity_args})   # standalone tests/oracle: no kvsnap target, says so
else()
  set_property(GLOBAL PROPERTY KVSNAP_FIDELITY_ARGS ${_fidelity_args})
  function(kvsnap_fidelity_add_test_deferred)
    get_property(args GLOBAL PROPERTY KVSNAP_FIDELITY_ARGS)
    kvsnap_fidelity_add_test(${args})
  endfunction()
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL kvsnap_fidelity_add_test_deferred)
endif()
