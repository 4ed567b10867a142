# Optional components. Each is an INTERFACE target that adds a backend's dependency on top of
# dtensor::dtensor; a component that is off or not found simply does not exist.

if(DTENSOR_WITH_MPI)
  find_package(MPI REQUIRED COMPONENTS CXX)
  find_package(Boost 1.74 REQUIRED COMPONENTS mpi serialization)
  add_library(dtensor_mpi INTERFACE)
  add_library(dtensor::mpi ALIAS dtensor_mpi)
  set_target_properties(dtensor_mpi PROPERTIES EXPORT_NAME mpi)
  target_link_libraries(dtensor_mpi INTERFACE dtensor::dtensor MPI::MPI_CXX Boost::mpi)
  target_compile_definitions(dtensor_mpi INTERFACE DTENSOR_HAS_MPI=1)
endif()

if(DTENSOR_WITH_BLAS)
  find_package(BLAS REQUIRED)
  find_path(DTENSOR_CBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES openblas REQUIRED)
  add_library(dtensor_blas INTERFACE)
  add_library(dtensor::blas ALIAS dtensor_blas)
  set_target_properties(dtensor_blas PROPERTIES EXPORT_NAME blas)
  target_link_libraries(dtensor_blas INTERFACE dtensor::dtensor BLAS::BLAS)
  target_include_directories(dtensor_blas INTERFACE ${DTENSOR_CBLAS_INCLUDE_DIR})
  target_compile_definitions(dtensor_blas INTERFACE DTENSOR_HAS_CBLAS=1)
endif()
