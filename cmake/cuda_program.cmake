# A program written against the CUDA runtime API (the demo, the integration
# test programs). It links libcudart.so.13 by name without an rpath, so the
# same binary runs on the simulated runtime (LD_LIBRARY_PATH=build/sim) and on
# a real GPU (the toolkit's runtime on the library path).
function(gpupool_cuda_program name)
  add_executable(${name} ${ARGN})
  target_include_directories(${name} PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE simcudart Threads::Threads)
  set_target_properties(${name} PROPERTIES SKIP_BUILD_RPATH ON CXX_VISIBILITY_PRESET default)
  target_compile_options(${name} PRIVATE -Wno-pedantic)
endfunction()
