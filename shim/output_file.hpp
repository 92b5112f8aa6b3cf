// The files gpupool writes inside the program's process: the report and the
// trace.
#pragma once

#include <string>
#include <string_view>

namespace gpupool::shim {

// Where the path came from. A path the user chose is opened as named: a
// symbolic link, a FIFO, a device. The report's default path lies in the
// temporary folder every user may write to, under a name anyone can predict
// (gpupool-<program>-<pid>): whatever another user put there is refused, so
// that gpupool neither writes through their link into another of the user's
// files nor blocks the program's exit on their FIFO.
enum class OutputPlace { Chosen, SharedTemporary };

struct OpenedOutput {
  int fd = -1;          // open for writing, emptied; -1 on failure
  std::string problem;  // why not, on failure
};

// Opens `path` for writing from its start, making missing folders (GPUPOOL_LOG
// and GPUPOOL_TRACE may name a new one: runs/%p/...). Never as descriptor 0,
// 1 or 2, which are free where the program started without them: its own
// output there would go into gpupool's file, and its next open or dup2 there
// would take gpupool's writes into its file. Retried when a signal the
// program handles without SA_RESTART interrupts a blocked open (a FIFO).
OpenedOutput open_output_file(const std::string& path, OutputPlace place);

// Writes all of `data`, going on after interrupted and partial writes. False
// with *error set (an errno value) on failure.
bool write_whole(int fd, std::string_view data, int* error);

}  // namespace gpupool::shim
