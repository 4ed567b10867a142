# tests/packaging/smoke.cmake — the consumer programs and their CTest tests, one definition for
# every consumer project (find_package, add_subdirectory, FetchContent, the vcpkg consumer and
# the Conan test_package), so that each way of getting dtensor runs the same distributed check.
#
#   include(<dtensor>/tests/packaging/smoke.cmake)
#   dtensor_consumer_smoke([MPI])     # once dtensor's targets exist
#
#   smoke        links dtensor::dtensor only; 4 ranks on the threads backend     (always)
#   smoke_mpi    links dtensor::mpi; 4 processes under mpiexec                   (MPI: required)
#   smoke_cuda   links dtensor::cuda; a link check, needs no GPU   (if the target exists and
#   smoke_nccl   links dtensor::nccl; a link check, needs no GPU    DTENSOR_SMOKE_GPU is on)
#
# Run them with `ctest --test-dir <build> --output-on-failure --no-tests=error`.
include_guard(GLOBAL)

set(DTENSOR_SMOKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
# Off where another consumer of the same package config already built them (saves CI time).
option(DTENSOR_SMOKE_GPU "Build the cuda and nccl link checks when those targets exist" ON)

function(dtensor_consumer_smoke)
  cmake_parse_arguments(PARSE_ARGV 0 arg "MPI" "" "")
  if(NOT TARGET dtensor::dtensor)
    message(FATAL_ERROR "dtensor_consumer_smoke: there is no target dtensor::dtensor; get dtensor "
                        "(find_package, add_subdirectory, FetchContent) before calling it")
  endif()

  add_executable(smoke "${DTENSOR_SMOKE_DIR}/smoke.cpp")
  target_link_libraries(smoke PRIVATE dtensor::dtensor)
  add_test(NAME smoke COMMAND smoke)
  set_tests_properties(smoke PROPERTIES TIMEOUT 60)

  if(arg_MPI)
    if(NOT TARGET dtensor::mpi)
      message(FATAL_ERROR "dtensor_consumer_smoke(MPI): there is no target dtensor::mpi")
    endif()
    if(NOT MPIEXEC_EXECUTABLE)
      message(FATAL_ERROR "dtensor_consumer_smoke(MPI): no MPIEXEC_EXECUTABLE (FindMPI found no mpiexec)")
    endif()
    # The project's own helper: mpiexec -n 4 with the OpenMPI settings a container needs.
    include("${DTENSOR_SMOKE_DIR}/../../cmake/DtensorMpiTest.cmake")
    dtensor_add_mpi_test(NAME smoke_mpi SOURCES "${DTENSOR_SMOKE_DIR}/mpi_smoke.cpp" RANKS 4 TIMEOUT 120)
    # The program checks that it got 4 ranks: an mpiexec of another MPI than the one linked
    # would start 4 singletons, each of which would pass on its own.
    set_property(TEST smoke_mpi_np4 APPEND PROPERTY ENVIRONMENT DTENSOR_SMOKE_RANKS=4)
  endif()

  # The GPU components: their usage requirements reach a plain C++ program (no GPU needed).
  if(TARGET dtensor::cuda AND DTENSOR_SMOKE_GPU)
    add_executable(smoke_cuda "${DTENSOR_SMOKE_DIR}/cuda_smoke.cpp")
    target_link_libraries(smoke_cuda PRIVATE dtensor::cuda)
    add_test(NAME smoke_cuda COMMAND smoke_cuda)
  endif()
  if(TARGET dtensor::nccl AND DTENSOR_SMOKE_GPU)
    add_executable(smoke_nccl "${DTENSOR_SMOKE_DIR}/nccl_smoke.cpp")
    target_link_libraries(smoke_nccl PRIVATE dtensor::nccl)
    add_test(NAME smoke_nccl COMMAND smoke_nccl)
  endif()
endfunction()
