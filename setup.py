"""Builds zero._C.

The torch-free core (csrc/core) is compiled once, by CMake, into libzero_core.a (the same
library the Catch2 tests link); this script links it into the extension together with the
ATen/c10d adapter (csrc/adapter) and the bindings (csrc/bindings/, one file per concern).

CUDA build only when the installed torch was built with CUDA *and* a toolkit is found:
nvcc alone (as on the CPU-only CI machine) does not make a CUDA build.
"""
import glob
import os
import subprocess
import sys

from setuptools import find_packages, setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
# ZERO_CMAKE_BUILD_DIR and ZERO_BUILD_TESTS=0 let a machine without Catch2 (the GPU machine of
# scripts/gpu_check.sh) build the core alone, apart from this checkout's usual build.
CMAKE_BUILD_DIR = os.environ.get("ZERO_CMAKE_BUILD_DIR", os.path.join(ROOT, "build", "cmake"))


def cuda_build_wanted() -> bool:
    if os.environ.get("ZERO_FORCE_CPU") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def build_core_with_cmake() -> str:
    """Configures (once) and builds the core library; returns the path of libzero_core.a."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    if not os.path.exists(os.path.join(CMAKE_BUILD_DIR, "CMakeCache.txt")):
        subprocess.check_call([
            "cmake", "-S", ROOT, "-B", CMAKE_BUILD_DIR, "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-DZERO_BUILD_TESTS=" + ("OFF" if os.environ.get("ZERO_BUILD_TESTS") == "0" else "ON"),
        ])
    jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    subprocess.check_call(["cmake", "--build", CMAKE_BUILD_DIR, "-j", jobs])
    return os.path.join(CMAKE_BUILD_DIR, "libzero_core.a")


def core_link_libraries() -> list[str]:
    """What libzero_core.a needs beyond libtorch (liburing when CMake found it)."""
    listing = os.path.join(CMAKE_BUILD_DIR, "zero_core_link_libraries.txt")
    if not os.path.exists(listing):
        return []
    with open(listing) as file:
        return [line.strip() for line in file if line.strip()]


def relative(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def make_extension(core_library: str):
    sources = relative([*glob.glob(os.path.join(ROOT, "csrc/bindings/*.cpp")),
                        *glob.glob(os.path.join(ROOT, "csrc/adapter/*.cpp"))])
    common = dict(
        name="zero._C",
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_objects=[core_library, *core_link_libraries()],
    )
    # Python's own CFLAGS carry -g: debug info for torch's and pybind11's templates doubles
    # the object files' compile time and makes a 60 MB module. ZERO_DEBUG_INFO=1 keeps it.
    cxx_flags = ["-O2"] + ([] if os.environ.get("ZERO_DEBUG_INFO") == "1" else ["-g0"])
    if cuda_build_wanted():
        cuda_sources = relative(glob.glob(os.path.join(ROOT, "csrc/cuda/*.cu")))
        return CUDAExtension(
            sources=sources + cuda_sources,
            define_macros=[("ZERO_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O2"]},
            **common,
        )
    return CppExtension(sources=sources, extra_compile_args={"cxx": cxx_flags}, **common)


class IncrementalBuildExtension(BuildExtension):
    """torch's BuildExtension (ninja compiles what changed; torch forces the rest to run), but
    a rebuild with nothing to do leaves zero/_C*.so as it is (the copy rewrites the file in
    place, under any process that has it loaded). The module is linked again when an object
    or extra library is newer, or when what the link takes changed (the sources, so a removed
    file's object goes too, the libraries and flags, torch's version: a stamp beside the
    objects); it is copied into zero/ unless the copy there is the same file (size, mtime)."""

    def build_extension(self, ext):
        stamp = os.path.join(self.build_temp, f"{ext.name}.link")
        signature = repr((sorted(ext.sources), ext.extra_objects, ext.libraries,
                          ext.library_dirs, ext.extra_link_args, torch.__version__))
        same = os.path.exists(stamp) and open(stamp).read() == signature
        self.compiler.force = not same  # else distutils links when an input is newer
        super().build_extension(ext)
        with open(stamp, "w") as file:
            file.write(signature)

    def copy_extensions_to_source(self):
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            name = self.get_ext_fullname(ext.name)
            package_dir = build_py.get_package_dir(name.rpartition(".")[0])
            inplace = os.path.join(package_dir, os.path.basename(self.get_ext_filename(name)))
            built = os.path.join(self.build_lib, self.get_ext_filename(name))
            if not _same_file_contents(built, inplace):
                self.copy_file(built, inplace, level=self.verbose)  # (keeps built's mtime)


def _same_file_contents(a: str, b: str) -> bool:
    """b is a copy of a that copy_file made (same size and modification time)."""
    if not (os.path.exists(a) and os.path.exists(b)):
        return False
    sa, sb = os.stat(a), os.stat(b)
    return sa.st_size == sb.st_size and sa.st_mtime_ns == sb.st_mtime_ns


def main():
    building = os.environ.get("ZERO_SKIP_EXT") != "1" and any(
        cmd.startswith(("build", "develop", "install", "bdist", "editable")) for cmd in sys.argv[1:])
    ext_modules = [make_extension(build_core_with_cmake())] if building else []
    setup(
        name="zero",
        version="0.1.0",
        description="ZeRO / sharded-optimizer memory engine for PyTorch",
        packages=find_packages(include=["zero", "zero.*", "offload", "offload.*"]),
        # Folders the launcher's ranks get on their PYTHONPATH, not packages of zero's: zero
        # standing in for `deepspeed` (zero/compat/deepspeed_alias.py) and the rank start-up.
        package_data={"zero.compat": ["as_deepspeed/*.py", "as_deepspeed/deepspeed/*.py",
                                      "as_deepspeed/deepspeed-*.dist-info/*"],
                      "zero.launcher": ["rank_startup/*.py"]},
        ext_modules=ext_modules,
        cmdclass={"build_ext": IncrementalBuildExtension},
        entry_points={"console_scripts": [
            "zero = zero.launcher.runner:main",
            "zero-mem = zero.reports.cli:main",
            "zero-report = zero.env_report:main",
        ]},
        install_requires=["tqdm"],
        python_requires=">=3.10",
    )


if __name__ == "__main__":
    main()
