# vcpkg port of dtensor (header-only). Use it as an overlay port from a dtensor checkout:
#   vcpkg install dtensor[mpi] --overlay-ports=<dtensor>/packaging/vcpkg/ports
# Nothing is compiled: configuring finds the dependencies of the enabled backends (so a missing
# MPI, CUDA or NCCL fails here, not in the consumer) and installs the headers and the CMake
# package config, which vcpkg_cmake_config_fixup then checks and relocates.
set(VCPKG_BUILD_TYPE release)   # header-only: one configuration is all there is

# The source. A port stamped by packaging/vcpkg/make-port.sh has a source.cmake naming a git URL
# and a commit: vcpkg fetches that commit (vcpkg_from_git), and since the commit is part of the
# port's files, vcpkg's ABI hash — the binary cache key — changes with every change of the
# headers. Without it (this folder used as an overlay port straight from a checkout) the port
# packages the tree around it: right for development, but the cache key then follows only the
# port's own files, so a stale binary package can be reused after the headers changed.
if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/source.cmake")
  include("${CMAKE_CURRENT_LIST_DIR}/source.cmake")  # DTENSOR_GIT_URL, DTENSOR_GIT_REF
  vcpkg_from_git(OUT_SOURCE_PATH SOURCE_PATH URL "${DTENSOR_GIT_URL}" REF "${DTENSOR_GIT_REF}" HEAD_REF main)
else()
  get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
  if(NOT EXISTS "${SOURCE_PATH}/include/dtensor" OR NOT EXISTS "${SOURCE_PATH}/cmake/dtensorConfig.cmake.in")
    message(FATAL_ERROR "dtensor port: ${SOURCE_PATH} is not a dtensor source tree; use this port from "
                        "packaging/vcpkg/ports of a dtensor checkout (--overlay-ports), or stamp one at a commit "
                        "with packaging/vcpkg/make-port.sh")
  endif()
  message(STATUS "dtensor port: packaging the checkout at ${SOURCE_PATH} (unversioned: the binary cache key does "
                 "not follow its headers; packaging/vcpkg/make-port.sh stamps a port at a commit)")
endif()

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    mpi   DTENSOR_WITH_MPI
    blas  DTENSOR_WITH_BLAS
    cuda  DTENSOR_WITH_CUDA
    nccl  DTENSOR_WITH_NCCL
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DDTENSOR_BUILD_TESTS=OFF
    -DDTENSOR_BUILD_EXAMPLES=OFF
    -DDTENSOR_BUILD_BENCHMARKS=OFF
    -DDTENSOR_INSTALL=ON
    -DDTENSOR_INSTALL_CMAKEDIR=share/${PORT}
    ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME ${PORT} CONFIG_PATH share/${PORT})

# Header-only: no libraries, no debug tree.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
