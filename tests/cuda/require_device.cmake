# KILN_REQUIRE_DEVICE=1 turns "no usable CUDA device" from a skip into a failure (exit 2, a
# FAILED line naming the reason); without it the runner skips (exit 77, ctest's skip). With a device both runs
# pass. RUNNER is the CUDA test runner; one quick test case is selected so a GPU machine does not
# run the suite twice.
set(filter "-tc=the device probe names the device")
execute_process(COMMAND ${RUNNER} ${filter} RESULT_VARIABLE plain_rc OUTPUT_VARIABLE plain_out ERROR_VARIABLE plain_err)
execute_process(COMMAND ${CMAKE_COMMAND} -E env KILN_REQUIRE_DEVICE=1 ${RUNNER} ${filter}
                RESULT_VARIABLE required_rc OUTPUT_VARIABLE required_out ERROR_VARIABLE required_err)
# 77: skipped (no device), which ctest shows as a skip for the `cuda` test.
if(NOT plain_rc EQUAL 0 AND NOT plain_rc EQUAL 77)
  message(FATAL_ERROR "without KILN_REQUIRE_DEVICE the runner must pass (0) or skip (77), got ${plain_rc}: ${plain_out}${plain_err}")
endif()
if(plain_out MATCHES "skipped — no CUDA device" AND NOT plain_rc EQUAL 77)
  message(FATAL_ERROR "a runner that skipped must exit 77 (ctest's skip), got ${plain_rc}")
endif()
if(plain_out MATCHES "skipped — no CUDA device")
  if(NOT required_rc EQUAL 2 OR NOT required_err MATCHES "FAILED — KILN_REQUIRE_DEVICE is set and there is no usable CUDA device")
    message(FATAL_ERROR "with KILN_REQUIRE_DEVICE=1 and no device the runner must fail with exit 2 and say why; "
                        "got ${required_rc}: ${required_out}${required_err}")
  endif()
  message(STATUS "no device: the skip becomes exit 2 under KILN_REQUIRE_DEVICE=1, as required")
elseif(NOT required_rc EQUAL 0)
  message(FATAL_ERROR "with a device, KILN_REQUIRE_DEVICE=1 must change nothing; got ${required_rc}: ${required_out}${required_err}")
endif()
