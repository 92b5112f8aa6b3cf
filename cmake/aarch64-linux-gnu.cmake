# Cross-compiles gpupool for AArch64 Linux (Grace machines) with Debian's
# g++-aarch64-linux-gnu; scripts/cross-test builds with it and runs the tests
# under qemu. The header-only dependencies (spdlog, fmt, Boost, Catch2, the
# CUDA headers) are this machine's: the cross compiler searches /usr/include
# after its own, and their CMake files are found here.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# ctest runs the unit tests through it; the integration tests' programs (run
# by this machine's python3) need qemu registered with binfmt_misc.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /usr/aarch64-linux-gnu)
set(fmt_DIR /usr/lib/${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu/cmake/fmt CACHE PATH "")
set(spdlog_DIR /usr/lib/${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu/cmake/spdlog CACHE PATH "")
set(Catch2_DIR /usr/lib/cmake/Catch2 CACHE PATH "")
# FindCUDAToolkit's static-runtime target wants librt (nothing here links it).
set(CUDAToolkit_rt_LIBRARY /usr/aarch64-linux-gnu/lib/librt.a CACHE FILEPATH "")
