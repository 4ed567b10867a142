# cmake -DCOMMAND=<compiler command, its arguments separated by '|'> -DOUTPUT=<file> -P run_compile_fail.cmake
# Runs a compile that must fail (every failing case of a compile-fail source, CMakeLists.txt) and
# writes its output to OUTPUT for the cases' tests; an error when the compile succeeds (then no
# case failed) or when the compiler could not be run.
string(REPLACE "|" ";" COMMAND "${COMMAND}")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
file(WRITE "${OUTPUT}" "${out}")
if(result STREQUAL "0")
  message(FATAL_ERROR "compile-fail: every failing case compiled together, and the compile succeeded:\n${COMMAND}")
elseif(NOT result MATCHES "^[0-9]+$")
  message(FATAL_ERROR "compile-fail: the compiler did not run (${result}):\n${COMMAND}")
endif()
message(STATUS "compile-fail: the compile failed as it must (exit ${result}); output in ${OUTPUT}")
