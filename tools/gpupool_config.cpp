// gpupool-config: the option table and what the current environment makes of
// it. `gpupool config` runs this; `--markdown` prints the README's table.
#include <cstdio>
#include <cstring>
#include <string>

#include "config/config.hpp"

int main(int argc, char** argv) {
  using namespace gpupool::config;
  if (argc > 1 && std::strcmp(argv[1], "--markdown") == 0) {
    std::fputs(markdown_table().c_str(), stdout);
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: gpupool-config [--markdown]\n");
    return 2;
  }
  const ParsedConfig parsed = parse_config(process_environment());
  std::printf("%-36s %-14s %-14s %s\n", "VARIABLE", "DEFAULT", "IN EFFECT", "WHAT IT DOES");
  for (const OptionInfo& o : option_table()) {
    const std::string now = o.show(parsed.config);
    std::printf("%-36s %-14s %-14s %s%s\n", o.variable.c_str(), o.default_text.c_str(), now.c_str(),
                now == o.default_text ? "" : "* ", o.description.c_str());
  }
  std::printf("\n(* set by the environment; GPUPOOL_CONF takes PYTORCH_CUDA_ALLOC_CONF syntax)\n");
  std::fflush(stdout);  // the table whole before the lines on stderr, where both go to one terminal or file
  for (const Problem& p : parsed.problems) std::fprintf(stderr, "%s\n", p.line().c_str());
  for (const std::string& note : parsed.notes) std::fprintf(stderr, "%s\n", note.c_str());
  return parsed.problems.empty() ? 0 : 1;
}
