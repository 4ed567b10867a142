# vcpkg port of dtensor (header-only). Use it as an overlay port from a dtensor checkout:
#   vcpkg install dtensor[mpi] --overlay-ports=<dtensor>/packaging/vcpkg/ports
# Nothing is compiled: configuring finds the dependencies of the enabled backends (so a missing
# MPI, CUDA or NCCL fails here, not in the consumer) and installs the headers and the CMake
# package config, which vcpkg_cmake_config_fixup then checks and relocates.
set(VCPKG_BUILD_TYPE release)   # header-only: one configuration is all there is

# The source: the dtensor tree that holds this overlay port (ports/dtensor -> 4 levels up).
# When dtensor is published, replace this with
#   vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO <owner>/dtensor REF "v${VERSION}"
#                     SHA512 <sha512 of the archive> HEAD_REF main)
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/dtensor" OR NOT EXISTS "${SOURCE_PATH}/cmake/dtensorConfig.cmake.in")
  message(FATAL_ERROR "dtensor port: ${SOURCE_PATH} is not a dtensor source tree; use this port "
                      "from packaging/vcpkg/ports of a dtensor checkout (--overlay-ports)")
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
