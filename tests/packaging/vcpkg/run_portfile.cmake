# Runs the vcpkg port's real portfile.cmake without vcpkg (which cannot be downloaded here), with
# stand-ins for the vcpkg helpers it calls. Each stand-in does what the vcpkg helper does for a
# header-only CMake port, with vcpkg's own arguments, and then a subset of vcpkg's post-build
# checks runs on the package tree.
#
#   cmake -DPORT_DIR=packaging/vcpkg/ports/dtensor -DWORK_DIR=/tmp/x "-DFEATURES=core;mpi" \
#         -P tests/packaging/vcpkg/run_portfile.cmake
#
# Result: ${WORK_DIR}/packages/<port>_x64-linux, the tree `vcpkg install` would copy into
# installed/x64-linux.
cmake_minimum_required(VERSION 3.25)

foreach(v PORT_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_portfile: pass -D${v}=...")
  endif()
endforeach()
get_filename_component(PORT_DIR "${PORT_DIR}" ABSOLUTE)
get_filename_component(PORT "${PORT_DIR}" NAME)

# The variables vcpkg defines for a portfile.
file(READ "${PORT_DIR}/vcpkg.json" _manifest)
string(JSON VERSION ERROR_VARIABLE _err GET "${_manifest}" version-semver)
if(_err)
  string(JSON VERSION GET "${_manifest}" version)
endif()
string(JSON _features ERROR_VARIABLE _err GET "${_manifest}" features)
list(APPEND FEATURES core)
list(REMOVE_DUPLICATES FEATURES)
foreach(f IN LISTS FEATURES)
  if(NOT f STREQUAL "core")
    string(JSON _feature ERROR_VARIABLE _err GET "${_manifest}" features ${f})
    if(_err)
      message(FATAL_ERROR "run_portfile: ${PORT} has no feature '${f}'")
    endif()
  endif()
endforeach()
set(TARGET_TRIPLET x64-linux)
set(CURRENT_PACKAGES_DIR "${WORK_DIR}/packages/${PORT}_${TARGET_TRIPLET}")
set(CURRENT_BUILDTREES_DIR "${WORK_DIR}/buildtrees/${PORT}")
set(CURRENT_INSTALLED_DIR "${WORK_DIR}/installed/${TARGET_TRIPLET}")
set(VCPKG_TARGET_IS_LINUX ON)
set(VCPKG_LIBRARY_LINKAGE static)
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}")
file(MAKE_DIRECTORY "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}")

function(_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "run_portfile: failed (${rc}): ${cmd}")
  endif()
endfunction()

function(vcpkg_from_github)
  message(FATAL_ERROR "run_portfile: vcpkg_from_github needs the network; the port must use the local tree")
endfunction()

# vcpkg_from_git: the commit REF of URL, checked out into the build trees (a local file:// URL
# needs no network). vcpkg requires REF to be a full commit SHA; so does the stand-in.
find_package(Git QUIET)
function(vcpkg_from_git)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_SOURCE_PATH;URL;REF;HEAD_REF" "PATCHES")
  if(NOT arg_REF MATCHES "^[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]+$")
    message(FATAL_ERROR "vcpkg_from_git: REF '${arg_REF}' is not a commit SHA")
  endif()
  string(LENGTH "${arg_REF}" n)
  if(NOT n EQUAL 40)
    message(FATAL_ERROR "vcpkg_from_git: REF '${arg_REF}' is not a full 40-hex commit SHA")
  endif()
  if(NOT GIT_EXECUTABLE)
    message(FATAL_ERROR "run_portfile: vcpkg_from_git needs git")
  endif()
  set(src "${CURRENT_BUILDTREES_DIR}/src/${arg_REF}")
  file(REMOVE_RECURSE "${src}")
  _run("${GIT_EXECUTABLE}" clone --quiet --no-checkout "${arg_URL}" "${src}")
  _run("${GIT_EXECUTABLE}" -C "${src}" checkout --quiet "${arg_REF}")
  set(${arg_OUT_SOURCE_PATH} "${src}" PARENT_SCOPE)
endfunction()

# vcpkg_check_features: -D<var>=ON for each feature asked for, OFF for the others.
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS;PREFIX" "FEATURES;INVERTED_FEATURES")
  set(opts "")
  list(LENGTH arg_FEATURES n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET arg_FEATURES ${i} name)
    list(GET arg_FEATURES ${j} var)
    if(name IN_LIST FEATURES)
      list(APPEND opts "-D${var}=ON")
    else()
      list(APPEND opts "-D${var}=OFF")
    endif()
  endforeach()
  set(${arg_OUT_FEATURE_OPTIONS} "${opts}" PARENT_SCOPE)
endfunction()

# vcpkg_cmake_configure: one build tree per configuration, vcpkg's standard arguments; Ninja as
# vcpkg uses it, or CMake's default generator where ninja is not installed.
find_program(_run_portfile_ninja ninja)
if(_run_portfile_ninja)
  set(_run_portfile_generator -G Ninja)
else()
  set(_run_portfile_generator "")
endif()
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE;OPTIONS_DEBUG")
  set(common
    ${_run_portfile_generator}
    -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON
    -DCMAKE_INSTALL_SYSTEM_RUNTIME_LIBS_SKIP=TRUE
    -DCMAKE_ERROR_ON_ABSOLUTE_INSTALL_DESTINATION=ON
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON
    -DBUILD_SHARED_LIBS=OFF
    "-DCMAKE_INSTALL_LIBDIR:STRING=lib"
    "-DCMAKE_INSTALL_BINDIR:STRING=bin"
    "-DCMAKE_PREFIX_PATH=${CURRENT_INSTALLED_DIR}"
    ${arg_OPTIONS})
  _run("${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel"
       ${common} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}" ${arg_OPTIONS_RELEASE})
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    _run("${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-dbg"
         ${common} -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}/debug" ${arg_OPTIONS_DEBUG})
  endif()
endfunction()

# vcpkg_cmake_install: build the install target of each configuration.
function(vcpkg_cmake_install)
  foreach(cfg IN ITEMS rel dbg)
    if(EXISTS "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-${cfg}")
      _run("${CMAKE_COMMAND}" --build "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-${cfg}" --target install)
    endif()
  endforeach()
endfunction()

# vcpkg_cmake_config_fixup: the config must end up in share/<package>; the debug copy goes; no
# file may keep an absolute path into the package, build or source tree.
function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH" "")
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME "${PORT}")
  endif()
  if(NOT arg_CONFIG_PATH)
    set(arg_CONFIG_PATH "share/${arg_PACKAGE_NAME}")
  endif()
  set(dest "${CURRENT_PACKAGES_DIR}/share/${arg_PACKAGE_NAME}")
  if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    # vcpkg would move it and rewrite the prefix computations; the port installs it in place.
    message(FATAL_ERROR "run_portfile: moving ${arg_CONFIG_PATH} to share/${arg_PACKAGE_NAME} is not emulated")
  endif()
  if(NOT EXISTS "${dest}/${arg_PACKAGE_NAME}Config.cmake" AND NOT EXISTS "${dest}/${arg_PACKAGE_NAME}-config.cmake")
    message(FATAL_ERROR "vcpkg_cmake_config_fixup: no ${arg_PACKAGE_NAME}Config.cmake in ${dest}")
  endif()
  file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug/share")
  file(GLOB cfgs "${dest}/*.cmake")
  foreach(f IN LISTS cfgs)
    file(READ "${f}" text)
    foreach(p IN ITEMS "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}" "${SOURCE_PATH}")
      string(FIND "${text}" "${p}" at)
      if(at GREATER -1)
        message(FATAL_ERROR "vcpkg_cmake_config_fixup: ${f} holds the absolute path ${p}")
      endif()
    endforeach()
  endforeach()
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  set(text "")
  foreach(f IN LISTS arg_FILE_LIST)
    file(READ "${f}" t)
    string(APPEND text "${t}")
  endforeach()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()

message(STATUS "run_portfile: ${PORT} ${VERSION} [${FEATURES}] -> ${CURRENT_PACKAGES_DIR}")
include("${PORT_DIR}/portfile.cmake")

# Post-build checks (a subset of vcpkg's): what a header-only port must and must not install.
set(P "${CURRENT_PACKAGES_DIR}")
foreach(f IN ITEMS "share/${PORT}/copyright" "share/${PORT}/usage" "share/${PORT}/${PORT}Config.cmake"
                   "share/${PORT}/${PORT}ConfigVersion.cmake")
  if(NOT EXISTS "${P}/${f}")
    message(FATAL_ERROR "post-build check: ${f} is missing")
  endif()
endforeach()
file(GLOB_RECURSE headers "${P}/include/*")
if(NOT headers)
  message(FATAL_ERROR "post-build check: include/ is empty")
endif()
foreach(d IN ITEMS lib bin debug "share/cmake" "lib/cmake")
  if(EXISTS "${P}/${d}")
    message(FATAL_ERROR "post-build check: a header-only port must not install ${d}/")
  endif()
endforeach()
file(GLOB_RECURSE shared "${P}/share/*")
foreach(f IN LISTS shared)
  file(READ "${f}" text)
  foreach(p IN ITEMS "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}")
    string(FIND "${text}" "${p}" at)
    if(at GREATER -1)
      message(FATAL_ERROR "post-build check: ${f} holds the absolute path ${p}")
    endif()
  endforeach()
endforeach()
message(STATUS "run_portfile: ${PORT} ${VERSION} packaged and checked: ${P}")
