# FindCUDNN — cuDNN 9 and the header-only cudnn-frontend (its C++ graph API), for the fused
# attention of kernels/cuda/attention_cudnn.cuh.
#
#   find_package(CUDNN [REQUIRED])   # -> CUDNN_FOUND, CUDNN_VERSION, imported target CUDNN::CUDNN
#
# cuDNN (cudnn.h, libcudnn): CUDNN_ROOT (variable or environment), next to the CUDA toolkit
# (whose lib64 holds it on the development machines), pip's nvidia-cudnn-cu* wheel (beside
# PyTorch on a GPU machine), the system paths. cudnn-frontend (cudnn_frontend.h):
# CUDNN_FRONTEND_ROOT, the folder scripts/fetch-cudnn-frontend.sh fills (a pinned release's
# headers, taken from its PyPI wheel), pip's site-packages/include (the nvidia-cudnn-frontend
# wheel puts its headers there), the system paths. Results: the cache variables
# DTENSOR_CUDNN_INCLUDE_DIR, DTENSOR_CUDNN_LIBRARY and DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR (the
# names the installed package config uses too, so one hint works for both).

set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
list(APPEND _cudnn_hints /usr/local/cuda)
set(_cudnn_fe_hints ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT})
if(DEFINED ENV{DTENSOR_DEPS_DIR})
  list(APPEND _cudnn_fe_hints "$ENV{DTENSOR_DEPS_DIR}/cudnn-frontend")
endif()
list(APPEND _cudnn_fe_hints "$ENV{HOME}/.cache/dtensor/cudnn-frontend")
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import nvidia.cudnn as n; print(list(n.__path__)[0])"
                  OUTPUT_VARIABLE _cudnn_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_cudnn_pip)
    list(APPEND _cudnn_hints "${_cudnn_pip}")
  endif()
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                  OUTPUT_VARIABLE _cudnn_purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_cudnn_purelib)
    list(APPEND _cudnn_fe_hints "${_cudnn_purelib}")
  endif()
endif()

find_path(DTENSOR_CUDNN_INCLUDE_DIR NAMES cudnn.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(DTENSOR_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_cudnn_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
find_path(DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR NAMES cudnn_frontend.h HINTS ${_cudnn_fe_hints} PATH_SUFFIXES include)

set(CUDNN_VERSION "")
if(DTENSOR_CUDNN_INCLUDE_DIR AND EXISTS "${DTENSOR_CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${DTENSOR_CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_v REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX REPLACE ".*#define CUDNN_${_part} +([0-9]+).*" "\\1" CUDNN_VERSION_${_part} "${_cudnn_v}")
  endforeach()
  set(CUDNN_VERSION "${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCHLEVEL}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS DTENSOR_CUDNN_LIBRARY DTENSOR_CUDNN_INCLUDE_DIR
                                  DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND CUDNN_VERSION_MAJOR LESS 9)
  message(STATUS "cuDNN ${CUDNN_VERSION} is older than 9: not used")
  set(CUDNN_FOUND FALSE)
endif()
if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES IMPORTED_LOCATION "${DTENSOR_CUDNN_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${DTENSOR_CUDNN_INCLUDE_DIR};${DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR}"
                        # DTENSOR_HAS_CUDNN: what dtensor's headers test (on this target, so that the
                        # build and the installed config add it alike, with the library); the
                        # frontend without its JSON (de)serialisation: ~15 % less nvcc time per unit
                        INTERFACE_COMPILE_DEFINITIONS "DTENSOR_HAS_CUDNN=1;CUDNN_FRONTEND_SKIP_JSON_LIB")
  # cudnn-frontend's runtime-compiled engines call NVRTC (the CUDA toolkit's CUDA::nvrtc).
  if(TARGET CUDA::nvrtc)
    set_property(TARGET CUDNN::CUDNN APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::nvrtc)
  endif()
endif()
mark_as_advanced(DTENSOR_CUDNN_INCLUDE_DIR DTENSOR_CUDNN_LIBRARY DTENSOR_CUDNN_FRONTEND_INCLUDE_DIR)
