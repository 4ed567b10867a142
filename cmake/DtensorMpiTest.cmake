# dtensor_add_mpi_test(NAME name SOURCES a.cpp ... RANKS 4 8
#                      [LIBRARIES lib ...] [TIMEOUT seconds] [PASS_REGULAR_EXPRESSION regex])
#
# Builds one executable (linked with dtensor::mpi and LIBRARIES) and adds one CTest test per
# rank count, name_npN, that runs it under ${MPIEXEC_EXECUTABLE} with N processes. The tests
# carry the label "mpi" (ctest -L mpi) and an environment that lets OpenMPI run as root,
# oversubscribe the cores (more ranks than cores, as on a 2-core CI machine) and yield idle
# ranks to the busy ones instead of spinning, without which oversubscribed runs crawl.
include_guard(GLOBAL)

# OpenMPI's own launcher flags; other MPIs' mpiexec would reject them.
if(NOT DEFINED DTENSOR_MPIEXEC_IS_OPENMPI AND MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _dtensor_mpiexec_version
                  ERROR_QUIET RESULT_VARIABLE _dtensor_mpiexec_rc)
  if(_dtensor_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(DTENSOR_MPIEXEC_IS_OPENMPI ON CACHE INTERNAL "mpiexec is OpenMPI's")
  else()
    set(DTENSOR_MPIEXEC_IS_OPENMPI OFF CACHE INTERNAL "mpiexec is OpenMPI's")
  endif()
endif()

function(dtensor_add_mpi_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TIMEOUT;PASS_REGULAR_EXPRESSION" "SOURCES;RANKS;LIBRARIES")
  if(NOT arg_NAME OR NOT arg_SOURCES OR NOT arg_RANKS)
    message(FATAL_ERROR "dtensor_add_mpi_test: NAME, SOURCES and RANKS are required")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()

  add_executable(${arg_NAME} ${arg_SOURCES})
  target_link_libraries(${arg_NAME} PRIVATE dtensor::mpi ${arg_LIBRARIES})
  if(COMMAND dtensor_warnings)
    dtensor_warnings(${arg_NAME})
  endif()

  set(launcher_flags "")
  if(DTENSOR_MPIEXEC_IS_OPENMPI)
    # -x: the settings reach ranks that mpirun starts on other hosts too (an environment
    # reaches only this host's); the ranks check that they agree (comm/env_agreement.hpp).
    set(launcher_flags --allow-run-as-root --oversubscribe -x DTENSOR_TIMEOUT_MS)
  endif()
  # A collective that hangs becomes a dtensor timeout Error (30 s) well before CTest's TIMEOUT.
  set(env
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1
    OMPI_MCA_mpi_yield_when_idle=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none
    OMPI_MCA_btl_base_warn_component_unused=0
    DTENSOR_TIMEOUT_MS=30000)

  foreach(n IN LISTS arg_RANKS)
    set(test ${arg_NAME}_np${n})
    add_test(NAME ${test}
             COMMAND ${MPIEXEC_EXECUTABLE} ${launcher_flags} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${arg_NAME}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test} PROPERTIES LABELS mpi TIMEOUT ${arg_TIMEOUT} PROCESSORS ${n}
                                            ENVIRONMENT "${env}")
    if(arg_PASS_REGULAR_EXPRESSION)
      set_tests_properties(${test} PROPERTIES PASS_REGULAR_EXPRESSION "${arg_PASS_REGULAR_EXPRESSION}")
    endif()
  endforeach()
endfunction()
