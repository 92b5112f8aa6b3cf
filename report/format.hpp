// Reports as text (laid out like torch.cuda.memory_summary()) and as JSON
// (schema in docs/report.schema.json). Both come from the same Report.
#pragma once

#include <string>

#include "report/report_data.hpp"

namespace gpupool::report {

std::string to_text(const Report& report);
std::string to_json(const Report& report);

// "0x7f..." for a stream id; "cudaMalloc" for kAnyStream, "legacy" for 0x1.
std::string stream_name(StreamId id);

}  // namespace gpupool::report
