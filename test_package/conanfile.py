"""Conan test_package of dtensor: a CMake project that finds the package (CMakeDeps) and runs
its consumer programs (copies of tests/packaging's) as CTest tests: a 4-rank DTensor
redistribution on the threads backend; with -o "&:with_mpi=True" the same on MPI under
mpiexec -n 4; with -o "&:with_blas=True" a GEMM through dtensor::blas."""
from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class DtensorTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        # Tell the project which components the package must have, so that one lost by
        # package_info() is an error rather than a skipped test.
        options = self.dependencies["dtensor"].options
        tc.cache_variables["DTENSOR_EXPECT_MPI"] = bool(options.with_mpi)
        tc.cache_variables["DTENSOR_EXPECT_BLAS"] = bool(options.with_blas)
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        self.run(f"ctest --test-dir \"{self.build_folder}\" -C {self.settings.build_type} "
                 "--output-on-failure --no-tests=error", env="conanrun")
