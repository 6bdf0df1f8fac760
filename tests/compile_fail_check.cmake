# One compile-fail test (tests/compile_fail/*.cpp with the C++ compiler, tests/compile_fail_cuda/*.cu
# with nvcc), run by ctest as `cmake -P`:
#   -DCOMMAND=<compiler|flag|flag...> (the compile command without the file, "|"-separated)
#   -DSRC=<the file> -DEXPECT=<regex from its first line>
# Passes when
#   1. the file does not compile (a non-zero exit: a warning that happens to match is not enough),
#      and the compiler's output matches EXPECT (the static_assert's sentence);
#   2. the file compiles with -DKILN_COMPILE_FAIL_CONTROL, its positive control: the same program
#      with the defect fixed, so the failure above comes from the defect and nothing else.
string(REPLACE "|" ";" command "${COMMAND}")
execute_process(COMMAND ${command} ${SRC} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SRC} compiled, but it must fail with: ${EXPECT}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SRC} failed, but not with \"${EXPECT}\":\n${out}${err}")
endif()
execute_process(COMMAND ${command} -DKILN_COMPILE_FAIL_CONTROL ${SRC}
                RESULT_VARIABLE control_rc OUTPUT_VARIABLE control_out ERROR_VARIABLE control_err)
if(NOT control_rc EQUAL 0)
  message(FATAL_ERROR "${SRC}: the positive control (-DKILN_COMPILE_FAIL_CONTROL) does not compile:\n"
                      "${control_out}${control_err}")
endif()
