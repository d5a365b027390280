// A file's content replaced whole or not at all.
#include "os/replace_file.hpp"

#include "os/open_without_waiting.hpp"
#include "os/owned_fd.hpp"
#include "os/quiet_sigpipe.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace cohort::os {

bool write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // nothing taken, and no reason given
      return false;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

namespace {

// `text` written over what is at `path`, as a program's own open for
// writing would: created if missing, replaced if there. The open never
// waits for a reader: a FIFO that no process has open for reading fails
// (ENXIO), where a blocking open would hold up the writer, a failing
// process on its way out, until a reader came (a file under a lease is
// waited for, as any open waits). The writes block, as on any file.
bool write_in_place(const std::filesystem::path& path, std::string_view text) {
  const owned_fd fd(open_without_waiting(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (fd.get() < 0) return false;
  return write_all(fd.get(), text);
}

// Tells apart the unfinished files of this process's writes.
std::atomic<unsigned> unfinished{0};

// What replace_file renames over: a regular file of one link, this user's.
bool renamed_over(const struct stat& st) noexcept {
  return S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid();
}

}  // namespace

bool replaced_by_rename(const std::filesystem::path& path) noexcept {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0 && renamed_over(st);
}

bool replace_file(const std::filesystem::path& path, std::string_view text) {
  // Past RLIMIT_FSIZE, a write raises SIGXFSZ, whose default action would
  // end a failing program before it could say why: the write fails instead.
  const quiet_signal quiet(SIGXFSZ);
  struct stat st{};
  const bool there = ::lstat(path.c_str(), &st) == 0;
  if (there && !renamed_over(st)) return write_in_place(path, text);
  // Named after the target, so that what sweeps a folder's files by their
  // names' beginnings (a group's error files) takes one that a killed
  // process left too.
  std::filesystem::path temporary;
  owned_fd fd;
  do {
    temporary = unfinished_file(path, unfinished.fetch_add(1, std::memory_order_relaxed));
    fd = owned_fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  } while (fd.get() < 0 && errno == EEXIST);
  if (fd.get() < 0) return write_in_place(path, text);
  if (there) (void)::fchmod(fd.get(), st.st_mode & 07777);
  if (!write_all(fd.get(), text)) {
    const int error = errno;
    ::unlink(temporary.c_str());
    errno = error;
    return false;
  }
  if (::rename(temporary.c_str(), path.c_str()) == 0) return true;
  ::unlink(temporary.c_str());
  return write_in_place(path, text);
}

std::filesystem::path unfinished_file(const std::filesystem::path& path, unsigned n) {
  auto name = path;
  name += fmt::format(".{}-{}.tmp", ::getpid(), n);
  return name;
}

bool is_unfinished_file(std::string_view name, std::string_view file_name) noexcept {
  constexpr std::string_view suffix = ".tmp";
  if (!name.starts_with(file_name) || !name.ends_with(suffix)) return false;
  name = name.substr(file_name.size(), name.size() - file_name.size() - suffix.size());
  // What is left: ".<pid>-<n>".
  const auto digits = [](std::string_view part) {
    return !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const auto dash = name.find('-');
  return name.starts_with('.') && dash != std::string_view::npos && digits(name.substr(1, dash - 1)) &&
         digits(name.substr(dash + 1));
}

}  // namespace cohort::os
