"""Conan 2 recipe for dtensor, a header-only C++20 distributed-tensor library.

    conan create . -s compiler.cppstd=20                         # core + threads backend
    conan create . -s compiler.cppstd=20 -o "&:with_mpi=True"    # + the MPI backend

Consumers: `find_package(dtensor REQUIRED)` (CMakeDeps) and link `dtensor::dtensor`; the backends
are the components dtensor::mpi, dtensor::cuda and dtensor::nccl, present when their option is on.

The backends' dependencies come from the system, not from Conan: Boost.MPI and MPI
(with_mpi), the CUDA toolkit (with_cuda) and NCCL (with_nccl) are found by CMake when the
consumer configures (a build module that CMakeDeps includes), so the package itself works offline
and needs no remote. The package is the same for every option and setting (headers only).
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load, save
from conan.tools.scm import Version

required_conan_version = ">=2.0"

# Included by the config that CMakeDeps generates: attaches the system libraries of the backends
# to the component targets that the options turned on.
_SYSTEM_DEPS_MODULE = r"""# dtensor (Conan): find the system dependencies of the enabled backend components.
if(TARGET dtensor::mpi)
  get_property(_dtensor_done TARGET dtensor::mpi PROPERTY DTENSOR_CONAN_SYSTEM_DEPS)
  if(NOT _dtensor_done)
    find_package(MPI REQUIRED COMPONENTS CXX)
    find_package(Boost 1.74 REQUIRED COMPONENTS mpi serialization)
    set_property(TARGET dtensor::mpi APPEND PROPERTY INTERFACE_LINK_LIBRARIES MPI::MPI_CXX Boost::mpi)
    set_property(TARGET dtensor::mpi PROPERTY DTENSOR_CONAN_SYSTEM_DEPS TRUE)
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
"""


class DtensorConan(ConanFile):
    name = "dtensor"
    description = ("Header-only C++20 distributed tensors: device meshes, Shard/Replicate/Partial "
                   "placements, redistribution; threads, MPI and NCCL backends")
    topics = ("tensor", "distributed", "mpi", "nccl", "cuda", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_mpi": [True, False], "with_cuda": [True, False], "with_nccl": [True, False]}
    default_options = {"with_mpi": False, "with_cuda": False, "with_nccl": False}
    exports_sources = "include/*", "cmake/*", "CMakeLists.txt", "LICENSE*"
    no_copy_source = True

    # Compilers with the C++20 language and library that dtensor uses (concepts, <span>, <numbers>).
    _min_compiler = {"gcc": "11", "clang": "14", "apple-clang": "14", "msvc": "193", "intel-cc": "2023"}

    def set_version(self):
        if self.version:
            return
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        m = re.search(r"project\(\s*dtensor\s+VERSION\s+([0-9][0-9.]*)", text)
        if not m:
            raise ConanInvalidConfiguration("dtensor: no project(dtensor VERSION ...) in CMakeLists.txt")
        self.version = m.group(1)

    def validate(self):
        if self.options.with_nccl and not self.options.with_cuda:
            raise ConanInvalidConfiguration("dtensor: with_nccl=True needs with_cuda=True "
                                            "(NCCL communicates between CUDA devices)")
        if self.options.with_nccl and not self.options.with_mpi:
            raise ConanInvalidConfiguration("dtensor: with_nccl=True needs with_mpi=True "
                                            "(the NCCL backend is bootstrapped through MPI)")
        if self.options.with_nccl and self.settings.get_safe("os") != "Linux":
            raise ConanInvalidConfiguration("dtensor: with_nccl=True is supported on Linux only")
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)
        compiler = str(self.settings.get_safe("compiler"))
        version = self.settings.get_safe("compiler.version")
        minimum = self._min_compiler.get(compiler)
        if minimum and version and Version(version) < minimum:
            raise ConanInvalidConfiguration(
                f"dtensor needs C++20: {compiler} >= {minimum}, but {compiler} {version} was given")

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "*", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))
        copy(self, "LICENSE*", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        save(self, os.path.join(self.package_folder, self._system_deps_module), _SYSTEM_DEPS_MODULE)

    @property
    def _system_deps_module(self):
        return os.path.join("lib", "cmake", "dtensor", "dtensor-conan-system-deps.cmake")

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "dtensor")
        # The target of everything enabled; dtensor::dtensor is the core alone, as with the
        # package's own CMake config.
        self.cpp_info.set_property("cmake_target_name", "dtensor::all")
        self.cpp_info.set_property("cmake_build_modules", [self._system_deps_module])
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "dtensor::dtensor")
        core.includedirs = ["include"]
        core.bindirs = []
        core.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]

        def component(name, defines, requires):
            c = self.cpp_info.components[name]
            c.set_property("cmake_target_name", f"dtensor::{name}")
            c.defines = defines
            c.requires = requires
            c.includedirs = []
            c.bindirs = []
            c.libdirs = []

        if self.options.with_mpi:
            component("mpi", ["DTENSOR_HAS_MPI=1"], ["core"])
        if self.options.with_cuda:
            component("cuda", ["DTENSOR_HAS_CUDA=1"], ["core"])
        if self.options.with_nccl:
            component("nccl", ["DTENSOR_HAS_NCCL=1"], ["cuda", "mpi"])
