// Where a child's standard input, output or error goes.
#pragma once

#include "cohort/export.hpp"

#include <fcntl.h>

#include <filesystem>
#include <variant>

COHORT_API_BEGIN

namespace cohort {

/// One standard stream of a child. Files are opened by the parent before
/// the child starts, so a bad path is an error of `spawn`. The open never
/// waits: a FIFO that no process has open for reading fails an output's
/// open (ENXIO, the message says why), and one that no process has open
/// for writing is stdin all the same: a read returns end of file until a
/// writer opens it, though `poll` and `select` report nothing to read
/// until a first writer has come and gone. The child gets the file
/// blocking. A file under another process's lease is waited for, as a
/// plain open waits.
class stdio {
 public:
  struct inherit_t {};
  struct null_t {};
  struct pipe_t {};
  struct stdout_t {};
  struct file_t {
    std::filesystem::path path;
    int flags;  ///< 0: read for stdin, write+create+truncate for output
  };
  struct fd_t {
    int fd;  ///< duplicated into the child; the caller keeps its own
  };
  using kind = std::variant<inherit_t, null_t, pipe_t, stdout_t, file_t, fd_t>;

  /// The same stream as this process (the default).
  static stdio inherit() { return stdio(inherit_t{}); }
  /// /dev/null.
  static stdio null() { return stdio(null_t{}); }
  /// A pipe whose other end the child object holds as an asio pipe.
  static stdio pipe() { return stdio(pipe_t{}); }
  /// A file: read for stdin; for output created (0644) and truncated.
  static stdio file(std::filesystem::path path) { return stdio(file_t{std::move(path), 0}); }
  /// A file opened for appending (output only; created when missing).
  static stdio append(std::filesystem::path path) {
    return stdio(file_t{std::move(path), O_WRONLY | O_CREAT | O_APPEND});
  }
  /// A descriptor of this process, duplicated into the child.
  static stdio fd(int descriptor) { return stdio(fd_t{descriptor}); }
  /// For stderr only: wherever stdout goes (2>&1).
  static stdio same_as_stdout() { return stdio(stdout_t{}); }

  const kind& get() const noexcept { return kind_; }

 private:
  explicit stdio(kind k) : kind_(std::move(k)) {}
  kind kind_;
};

}  // namespace cohort

COHORT_API_END
