# FindNCCL — NCCL, the NVIDIA collective communication library.
#
#   find_package(NCCL [REQUIRED])      # -> NCCL_FOUND, NCCL_VERSION, imported target NCCL::NCCL
#
# Looks in NCCL_ROOT (variable or environment), then next to the CUDA toolkit (the toolkit found
# by FindCUDAToolkit, /usr/local/cuda), then in pip's nvidia-nccl wheel, then in the system paths.
# The results are the cache variables DTENSOR_NCCL_INCLUDE_DIR and DTENSOR_NCCL_LIBRARY, the same
# names the installed package config (dtensorConfig.cmake) uses, so one hint works for both.

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_p "${_d}" DIRECTORY)
    list(APPEND _nccl_hints "${_p}")
  endforeach()
endif()
list(APPEND _nccl_hints /usr/local/cuda)
# pip's NCCL (nvidia-nccl-cu*, e.g. beside PyTorch on a GPU machine without Debian's packages):
# site-packages/nvidia/nccl/{include,lib}, whose library is only libnccl.so.2.
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
                  OUTPUT_VARIABLE _nccl_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_nccl_pip)
    list(APPEND _nccl_hints "${_nccl_pip}")
  endif()
endif()

find_path(DTENSOR_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(DTENSOR_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(DTENSOR_NCCL_INCLUDE_DIR AND EXISTS "${DTENSOR_NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${DTENSOR_NCCL_INCLUDE_DIR}/nccl.h" _nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" NCCL_VERSION_${_part} "${_nccl_v}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS DTENSOR_NCCL_LIBRARY DTENSOR_NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${DTENSOR_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DTENSOR_NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(DTENSOR_NCCL_INCLUDE_DIR DTENSOR_NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_pip)
