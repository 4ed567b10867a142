"""Conan 2 recipe for dtensor, a header-only C++20 distributed-tensor library.

    conan create .                                # core + threads backend (any profile)
    conan create . -o "&:with_mpi=True"           # + the MPI backend

Consumers: `find_package(dtensor REQUIRED)` (CMakeDeps) and link `dtensor::dtensor`; the backends
are the components dtensor::mpi, dtensor::blas, dtensor::cuda and dtensor::nccl, which exist when
their option is on. find_package's COMPONENTS / OPTIONAL_COMPONENTS behave as with the package's own CMake
config: dtensor_<c>_FOUND for each one asked for; a REQUIRED one whose option is off fails.
C++20 is required, and the package brings it: its CMake targets carry cxx_std_20, so a consumer
configured from Conan's default profile (compiler.cppstd=gnu17) compiles dtensor's headers as
C++20 all the same; without CMake, compile with -std=c++20. The profile's cppstd does not change
the package (headers only), so it is not checked; the compiler must have C++20 (below).

The backends' dependencies come from the system, not from Conan: Boost.MPI and MPI
(with_mpi), a BLAS with cblas.h (with_blas), the CUDA toolkit (with_cuda) and NCCL (with_nccl) are found by CMake when the
consumer configures (packaging/conan/dtensor-conan-components.cmake, a build module that
CMakeDeps includes), so the package itself works offline and needs no remote. The package is
the same for every option and setting (headers only).
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.files import copy, load
from conan.tools.scm import Version

required_conan_version = ">=2.0"


class DtensorConan(ConanFile):
    name = "dtensor"
    description = ("Header-only C++20 distributed tensors: device meshes, Shard/Replicate/Partial "
                   "placements, redistribution; threads, MPI and NCCL backends")
    license = "MIT"
    topics = ("tensor", "distributed", "mpi", "nccl", "cuda", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_mpi": [True, False], "with_blas": [True, False], "with_cuda": [True, False],
               "with_nccl": [True, False]}
    default_options = {"with_mpi": False, "with_blas": False, "with_cuda": False, "with_nccl": False}
    # Headers only: package() copies include/; the version comes from CMakeLists.txt at export.
    exports_sources = "include/*", "LICENSE*", "packaging/conan/*"
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
        copy(self, self._build_module_name, src=os.path.join(self.source_folder, "packaging", "conan"),
             dst=os.path.join(self.package_folder, self._build_module_dir))

    # The build module that CMakeDeps includes: the system dependencies of the enabled backends,
    # and find_package COMPONENTS (packaging/conan/dtensor-conan-components.cmake says how).
    _build_module_name = "dtensor-conan-components.cmake"
    _build_module_dir = os.path.join("lib", "cmake", "dtensor")

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "dtensor")
        # The target of everything enabled; dtensor::dtensor is the core alone, as with the
        # package's own CMake config.
        self.cpp_info.set_property("cmake_target_name", "dtensor::all")
        self.cpp_info.set_property("cmake_build_modules",
                                   [os.path.join(self._build_module_dir, self._build_module_name)])
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
        if self.options.with_blas:
            component("blas", ["DTENSOR_HAS_CBLAS=1"], ["core"])
        if self.options.with_cuda:
            component("cuda", ["DTENSOR_HAS_CUDA=1"], ["core"])
        if self.options.with_nccl:
            component("nccl", ["DTENSOR_HAS_NCCL=1"], ["cuda", "mpi"])
