/* Stands in for the CUDA driver (it is built as libcuda.so.1) in tests of
   what gpupool says about a process that used CUDA where it cannot see: such
   a process has the driver loaded, which is all gpupool looks for. */
int fake_driver_version(void) { return 13000; }
