# dtensor-conan-components.cmake — a build module of the Conan package (conanfile.py), included at
# the end of the dtensor-config.cmake that CMakeDeps generates.
#
# 1. The backends' dependencies come from the system, not from Conan (the package is headers
#    only and works offline): for each component that the recipe's options created, find them
#    and attach them to the component's target. The option is the request for the backend, so
#    a dependency that is missing is an error that names it.
# 2. CMakeDeps ignores find_package's COMPONENTS; this gives them the meaning the package's own
#    config (cmake/dtensorConfig.cmake.in) gives them: dtensor_<c>_FOUND for each component
#    asked for, and a missing REQUIRED one fails find_package with the option to turn on,
#    while a missing OPTIONAL_COMPONENTS one is only reported.

# 0. C++20 comes with the package: CMakeDeps' targets carry no language standard, and Conan's
#    default profile says gnu17, so every target that links dtensor is raised to C++20 here
#    (CMake takes the higher of CMAKE_CXX_STANDARD and the usage requirement).
foreach(_dtensor_t IN ITEMS dtensor::dtensor dtensor::all)
  if(TARGET ${_dtensor_t})
    set_property(TARGET ${_dtensor_t} APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
  endif()
endforeach()
unset(_dtensor_t)

if(TARGET dtensor::mpi)
  get_property(_dtensor_done TARGET dtensor::mpi PROPERTY DTENSOR_CONAN_SYSTEM_DEPS)
  if(NOT _dtensor_done)
    find_package(MPI REQUIRED COMPONENTS CXX)
    find_package(Boost 1.74 REQUIRED COMPONENTS mpi serialization)
    set_property(TARGET dtensor::mpi APPEND PROPERTY INTERFACE_LINK_LIBRARIES MPI::MPI_CXX Boost::mpi)
    set_property(TARGET dtensor::mpi PROPERTY DTENSOR_CONAN_SYSTEM_DEPS TRUE)
  endif()
endif()
if(TARGET dtensor::blas)
  get_property(_dtensor_done TARGET dtensor::blas PROPERTY DTENSOR_CONAN_SYSTEM_DEPS)
  if(NOT _dtensor_done)
    find_package(BLAS REQUIRED)
    find_path(DTENSOR_CBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES openblas REQUIRED)
    set_property(TARGET dtensor::blas APPEND PROPERTY INTERFACE_LINK_LIBRARIES BLAS::BLAS)
    set_property(TARGET dtensor::blas APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${DTENSOR_CBLAS_INCLUDE_DIR}")
    set_property(TARGET dtensor::blas PROPERTY DTENSOR_CONAN_SYSTEM_DEPS TRUE)
  endif()
endif()
if(TARGET dtensor::cuda)
  get_property(_dtensor_done TARGET dtensor::cuda PROPERTY DTENSOR_CONAN_SYSTEM_DEPS)
  if(NOT _dtensor_done)
    find_package(CUDAToolkit REQUIRED)
    set_property(TARGET dtensor::cuda APPEND PROPERTY INTERFACE_LINK_LIBRARIES
                 CUDA::cudart CUDA::cublas CUDA::cublasLt)
    set_property(TARGET dtensor::cuda PROPERTY DTENSOR_CONAN_SYSTEM_DEPS TRUE)
  endif()
endif()
if(TARGET dtensor::nccl)
  get_property(_dtensor_done TARGET dtensor::nccl PROPERTY DTENSOR_CONAN_SYSTEM_DEPS)
  if(NOT _dtensor_done)
    find_library(DTENSOR_NCCL_LIBRARY NAMES nccl HINTS ${NCCL_ROOT} ENV NCCL_ROOT
                 ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 REQUIRED)
    find_path(DTENSOR_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${NCCL_ROOT} ENV NCCL_ROOT
              ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include REQUIRED)
    set_property(TARGET dtensor::nccl APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${DTENSOR_NCCL_LIBRARY}")
    set_property(TARGET dtensor::nccl APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${DTENSOR_NCCL_INCLUDE_DIR}")
    set_property(TARGET dtensor::nccl PROPERTY DTENSOR_CONAN_SYSTEM_DEPS TRUE)
  endif()
endif()
unset(_dtensor_done)

set(_dtensor_missing "")
foreach(_dtensor_c IN LISTS dtensor_FIND_COMPONENTS)
  if(TARGET dtensor::${_dtensor_c})
    set(dtensor_${_dtensor_c}_FOUND TRUE)
  else()
    set(dtensor_${_dtensor_c}_FOUND FALSE)
    if(_dtensor_c MATCHES "^(mpi|blas|cuda|nccl)$")
      set(_dtensor_why "the package was created without -o \"dtensor/*:with_${_dtensor_c}=True\"")
    else()
      set(_dtensor_why "unknown component (the Conan package of dtensor has: mpi, blas, cuda, nccl)")
    endif()
    if(dtensor_FIND_REQUIRED_${_dtensor_c})
      string(APPEND _dtensor_missing "\n  ${_dtensor_c}: ${_dtensor_why}")
    elseif(NOT dtensor_FIND_QUIETLY)
      message(STATUS "dtensor: optional component ${_dtensor_c} not available: ${_dtensor_why}")
    endif()
  endif()
endforeach()
if(NOT _dtensor_missing STREQUAL "")
  set(dtensor_FOUND FALSE)
  set(dtensor_NOT_FOUND_MESSAGE "required component(s) not available:${_dtensor_missing}")
endif()
unset(_dtensor_c)
unset(_dtensor_why)
unset(_dtensor_missing)
