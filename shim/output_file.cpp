#include "shim/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gpupool::shim {

namespace {

int open_retrying(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0 && fd <= STDERR_FILENO) {
    const int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    const int error = errno;
    ::close(fd);
    errno = error;
    fd = moved;
  }
  return fd;
}

int open_making_folders(const std::string& path, int flags) {
  const int fd = open_retrying(path, flags);
  if (fd >= 0 || errno != ENOENT) return fd;
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) return -1;  // errno still ENOENT
  // Made here, or by another process just now (ranks of one job starting
  // together, each making the job's folder for its own report): open then.
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    errno = ec.value();
    return -1;
  }
  return open_retrying(path, flags);
}

// What stops a file at a shared path from being written: anything but a
// regular file of this user's with no other name. (A hard link another user
// made to one of this user's files would be emptied by the report.)
std::string not_own_file(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "a file of another user";
  if (st.st_nlink != 1) return "a file with other names (hard links)";
  return {};
}

}  // namespace

OpenedOutput open_output_file(const std::string& path, OutputPlace place) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY;
  if (place == OutputPlace::Chosen) {
    const int fd = open_making_folders(path, kFlags | O_TRUNC);
    return fd >= 0 ? OpenedOutput{fd, {}} : OpenedOutput{-1, std::strerror(errno)};
  }
  // No link followed, no FIFO waited for (one without a reader fails at
  // once), nothing emptied before it is known to be the user's own file.
  const int fd = open_making_folders(path, kFlags | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) return {-1, "a symbolic link, which gpupool does not follow in a shared folder"};
    if (errno == ENXIO) return {-1, "not a regular file"};
    return {-1, std::strerror(errno)};
  }
  std::string problem = not_own_file(fd);
  // F_SETFL 0: blocking writes again.
  if (problem.empty() && (ftruncate(fd, 0) != 0 || fcntl(fd, F_SETFL, 0) != 0)) problem = std::strerror(errno);
  if (problem.empty()) return {fd, {}};
  ::close(fd);
  return {-1, problem};
}

bool write_whole(int fd, std::string_view data, int* error) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *error = w < 0 ? errno : EIO;
      return false;
    }
    done += static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace gpupool::shim
