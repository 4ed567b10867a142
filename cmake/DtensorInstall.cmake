# Installation: headers, the exported targets and the CMake package config.
#
#   <prefix>/include/dtensor/...                          the headers
#   <prefix>/share/dtensor/dtensorConfig.cmake            package config (from dtensorConfig.cmake.in)
#   <prefix>/share/dtensor/dtensorConfigVersion.cmake     version file (header-only: arch-independent)
#   <prefix>/share/dtensor/dtensorTargets.cmake           dtensor::dtensor
#   <prefix>/share/dtensor/dtensor_<comp>Targets.cmake    one file per component enabled in this build
#   <prefix>/share/dtensor/FindNCCL.cmake                 how the config finds NCCL (nccl component)
#   <prefix>/share/dtensor/FindCUDNN.cmake                how the config finds cuDNN (cuda component)
#
# Each component lives in its own export file so that the config can load it only after it has
# found that component's dependencies; a component that this build did not enable is still
# available to consumers: the config defines it itself when its dependencies are found (the
# library is header-only, so nothing of it had to be built). See cmake/dtensorConfig.cmake.in.
#
# DTENSOR_INSTALL (default: on when dtensor is the top-level project) switches all of this on.

option(DTENSOR_INSTALL "Generate the install rules (headers, CMake package config)" ${dtensor_IS_TOP_LEVEL})
set(DTENSOR_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/dtensor"
    CACHE STRING "Where the CMake package config is installed, relative to the prefix")

if(DTENSOR_INSTALL)
  include(CMakePackageConfigHelpers)

  # The whole include/dtensor tree (.hpp, and the .cuh of the CUDA parts): nothing is compiled.
  install(DIRECTORY "${dtensor_SOURCE_DIR}/include/dtensor" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
          COMPONENT dtensor_headers)

  install(TARGETS dtensor EXPORT dtensorTargets)
  install(EXPORT dtensorTargets NAMESPACE dtensor:: FILE dtensorTargets.cmake
          DESTINATION "${DTENSOR_INSTALL_CMAKEDIR}" COMPONENT dtensor_headers)

  # The components this build defined (cmake/DtensorComponents.cmake), each in its own file.
  set(DTENSOR_BUILT_COMPONENTS "")
  foreach(_dtensor_comp IN ITEMS mpi blas cuda nccl)
    if(TARGET dtensor_${_dtensor_comp})
      install(TARGETS dtensor_${_dtensor_comp} EXPORT dtensor_${_dtensor_comp}Targets)
      install(EXPORT dtensor_${_dtensor_comp}Targets NAMESPACE dtensor::
              FILE dtensor_${_dtensor_comp}Targets.cmake
              DESTINATION "${DTENSOR_INSTALL_CMAKEDIR}" COMPONENT dtensor_headers)
      list(APPEND DTENSOR_BUILT_COMPONENTS ${_dtensor_comp})
    endif()
  endforeach()
  unset(_dtensor_comp)

  configure_package_config_file(
    "${CMAKE_CURRENT_LIST_DIR}/dtensorConfig.cmake.in"
    "${CMAKE_CURRENT_BINARY_DIR}/dtensorConfig.cmake"
    INSTALL_DESTINATION "${DTENSOR_INSTALL_CMAKEDIR}")
  write_basic_package_version_file(
    "${CMAKE_CURRENT_BINARY_DIR}/dtensorConfigVersion.cmake"
    VERSION "${PROJECT_VERSION}"
    COMPATIBILITY SameMinorVersion   # 0.x: a new minor version may break the API
    ARCH_INDEPENDENT)
  # FindNCCL.cmake: the config finds NCCL with the same module the build uses.
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/dtensorConfig.cmake"
                "${CMAKE_CURRENT_BINARY_DIR}/dtensorConfigVersion.cmake"
                "${dtensor_SOURCE_DIR}/cmake/FindNCCL.cmake"
                "${dtensor_SOURCE_DIR}/cmake/FindCUDNN.cmake"
          DESTINATION "${DTENSOR_INSTALL_CMAKEDIR}" COMPONENT dtensor_headers)
  install(FILES "${dtensor_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/dtensor"
          COMPONENT dtensor_headers)
endif()
