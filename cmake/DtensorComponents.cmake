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
  # This machine's cblas.h path stays out of the installed export: the package config finds
  # cblas.h again on the consumer's machine (cmake/dtensorConfig.cmake.in).
  target_include_directories(dtensor_blas INTERFACE $<BUILD_INTERFACE:${DTENSOR_CBLAS_INCLUDE_DIR}>)
  target_compile_definitions(dtensor_blas INTERFACE DTENSOR_HAS_CBLAS=1)
endif()

# CUDA: the cuda memory space, the kernels (cuBLAS/cuBLASLt) and the one-GPU multi-rank
# communicator. Its headers are .cuh and compile with nvcc; device code needs relaxed constexpr
# because the element types' arithmetic (bfloat16, reduce_pair) is constexpr host code.
if(DTENSOR_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "GPU architectures to build for, e.g. 80;90 (default 90: H100)")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(dtensor_cuda INTERFACE)
  add_library(dtensor::cuda ALIAS dtensor_cuda)
  set_target_properties(dtensor_cuda PROPERTIES EXPORT_NAME cuda)
  target_link_libraries(dtensor_cuda INTERFACE dtensor::dtensor CUDA::cudart CUDA::cublas CUDA::cublasLt)
  # -std=c++20 by hand: CMake 3.25 does not know nvcc 13's language levels (cuda_std_20 fails).
  target_compile_options(dtensor_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
  target_compile_definitions(dtensor_cuda INTERFACE DTENSOR_HAS_CUDA=1)
  # cuDNN 9 + cudnn-frontend: bf16 attention on cuDNN's fused kernels (attention_cudnn.cuh).
  # AUTO uses them where found (scripts/fetch-cudnn-frontend.sh fetches the headers); the found
  # paths stay out of the installed export, as NCCL's: the package config finds them again.
  set(DTENSOR_WITH_CUDNN AUTO CACHE STRING "cuDNN fused attention for bf16: AUTO (where found), ON or OFF")
  if(NOT DTENSOR_WITH_CUDNN STREQUAL "OFF")
    if(DTENSOR_WITH_CUDNN STREQUAL "ON")
      find_package(CUDNN REQUIRED)
    else()
      find_package(CUDNN QUIET)
    endif()
    if(CUDNN_FOUND)
      target_link_libraries(dtensor_cuda INTERFACE $<BUILD_INTERFACE:CUDNN::CUDNN>)  # + DTENSOR_HAS_CUDNN=1
      message(STATUS "dtensor: cuDNN ${CUDNN_VERSION} attention (${DTENSOR_CUDNN_LIBRARY}, cudnn-frontend in ${DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR})")
    else()
      message(STATUS "dtensor: no cuDNN 9 + cudnn-frontend (scripts/fetch-cudnn-frontend.sh): bf16 attention on cuBLAS")
    endif()
  endif()
endif()

# NCCL: the GPU communicator, bootstrapped through MPI (rank 0's ncclUniqueId is broadcast).
if(DTENSOR_WITH_NCCL)
  if(NOT TARGET dtensor::cuda OR NOT TARGET dtensor::mpi)
    message(FATAL_ERROR "DTENSOR_WITH_NCCL=ON needs DTENSOR_WITH_CUDA=ON and DTENSOR_WITH_MPI=ON "
                        "(NCCL runs on GPUs and is started through MPI)")
  endif()
  find_package(NCCL REQUIRED)
  add_library(dtensor_nccl INTERFACE)
  add_library(dtensor::nccl ALIAS dtensor_nccl)
  set_target_properties(dtensor_nccl PROPERTIES EXPORT_NAME nccl)
  # NCCL's paths stay out of the installed export, as cblas.h's do: the package config finds
  # NCCL again on the consumer's machine (DTENSOR_NCCL_LIBRARY / DTENSOR_NCCL_INCLUDE_DIR).
  target_link_libraries(dtensor_nccl INTERFACE dtensor::cuda dtensor::mpi $<BUILD_INTERFACE:NCCL::NCCL>)
  target_compile_definitions(dtensor_nccl INTERFACE DTENSOR_HAS_NCCL=1)
endif()
