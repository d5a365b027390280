#include "run/report.hpp"

#include "run/say.hpp"

#include "launch/json_text.hpp"

#include <cohort/error_file.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/statvfs.h>

#include <ctime>
#include <fstream>
#include <iterator>
#include <string_view>

namespace cohort_run {

namespace {

std::string describe_status(const cohort::exit_status& status) {
  if (status.signaled()) return fmt::format("signal {} ({})", cohort::signal_name(status.signal()), status.signal());
  return std::to_string(status.code());
}

double in_seconds(std::chrono::microseconds t) { return std::chrono::duration<double>(t).count(); }

std::string local_time(std::chrono::system_clock::time_point when) {
  const auto seconds = std::chrono::system_clock::to_time_t(when);
  std::tm local{};
  ::localtime_r(&seconds, &local);
  return fmt::format("{:%Y-%m-%d_%H:%M:%S}", local);
}

// Whether the rank left a regular file at its error file's path, or a
// link to one (or one was kept for it): anything else there is no report.
bool has_error_file(const cohort::rank_failure& f) {
  std::error_code ec;
  return !f.error_file.empty() && std::filesystem::is_regular_file(std::filesystem::status(f.error_file, ec));
}

// What the summary says of a failed rank's error file: where it is, with
// why it was not read as a report where the group found no message in it;
// <N/A> where there is none, or none could be kept.
std::string error_file_text(const cohort::rank_failure& f) {
  if (!has_error_file(f)) return "<N/A>";
  const std::string path = f.error_file.string();
  if (!f.message.empty()) return path;
  std::error_code ec;
  const auto size = std::filesystem::file_size(f.error_file, ec);
  if (!ec && size == 0) return path + " (empty: no report)";
  if (!ec && size > cohort::max_error_file_size) {
    return fmt::format("{} (not read as a report: {} bytes, over the {} MiB limit)", path, size,
                       cohort::max_error_file_size / (1024 * 1024));
  }
  if (!cohort::read_error_file(f.error_file)) return path + " (not read as a report: not JSON in torchelastic's shape)";
  return path;
}

// A value of the summary with its lines after the first indented to the
// column where its first starts: a message of several lines stays clear of
// the labels.
std::string indented(std::string_view value) {
  constexpr std::string_view under_label = "               ";  // "  message    : "
  std::string text;
  for (std::size_t begin = 0;;) {
    const auto end = value.find('\n', begin);
    text += value.substr(begin, end - begin);
    if (end == std::string_view::npos) break;
    text += '\n';
    begin = end + 1;
    if (begin < value.size() && value[begin] != '\n') text += under_label;
  }
  return text;
}

void print_failure(const cohort::rank_failure& f, const run_record& run, const attempt_record& a) {
  const auto& usage = f.status.usage();
  say("  time       : {}\n", local_time(f.timestamp));
  say("  host       : {}\n", run.host);
  say("  rank       : {} (local_rank: {})\n", a.first_rank + f.rank, f.rank);
  say("  pid        : {}\n", f.pid);
  say("  exitcode   : {}\n", describe_status(f.status));
  say("  cpu time   : {:.3f} s user, {:.3f} s system\n", in_seconds(usage.user_time),
      in_seconds(usage.system_time));
  say("  peak rss   : {:.1f} MiB\n", static_cast<double>(usage.max_rss_kib) / 1024);
  say("  error_file : {}\n", error_file_text(f));
  if (!f.message.empty()) say("  message    : {}\n", indented(f.message));
  if (!f.supervisor_error.empty()) say("  supervisor : {}\n", indented(f.supervisor_error));
  if (!f.trace.empty()) {
    say("  traceback  :\n");
    std::string::size_type begin = 0;
    while (begin < f.trace.size()) {
      auto end = f.trace.find('\n', begin);
      if (end == std::string::npos) end = f.trace.size();
      say("    {}\n", std::string_view(f.trace).substr(begin, end - begin));
      begin = end + 1;
    }
  }
}

nlohmann::json status_json(const cohort::exit_status& status) {
  nlohmann::json j;
  if (status.signaled()) {
    j["signal"] = cohort::signal_name(status.signal());
  } else {
    j["exit_code"] = status.code();
  }
  const auto& usage = status.usage();
  j["cpu_user_s"] = in_seconds(usage.user_time);
  j["cpu_system_s"] = in_seconds(usage.system_time);
  j["max_rss_kib"] = usage.max_rss_kib;
  return j;
}

nlohmann::json attempt_json(const attempt_record& a) {
  nlohmann::json ranks = nlohmann::json::array();
  const auto& r = a.result;
  const auto* root = r.first_failure();
  for (std::size_t local = 0; local < r.statuses.size(); ++local) {
    nlohmann::json rank{{"rank", a.first_rank + static_cast<int>(local)}, {"local_rank", local}};
    if (local < a.pids.size()) rank["pid"] = a.pids[local];
    if (r.statuses[local]) {
      rank["status"] = status_json(*r.statuses[local]);
    } else {
      rank["status"] = "unreaped";
    }
    rank["failed"] = false;
    for (const auto& f : r.failures) {
      if (f.rank != static_cast<int>(local)) continue;
      rank["failed"] = true;
      if (has_error_file(f)) rank["error_file"] = f.error_file.string();  // it wrote one, kept
      if (!f.message.empty()) rank["message"] = f.message;
      if (!f.supervisor_error.empty()) rank["supervisor_error"] = f.supervisor_error;
      if (&f == root) rank["root_cause"] = true;
    }
    ranks.push_back(std::move(rank));
  }
  nlohmann::json j{{"attempt", a.attempt},
                   {"outcome", a.outcome},
                   {"node_rank", a.node_rank},
                   {"nnodes", a.nnodes},
                   {"world_size", a.world_size},
                   {"started", local_time(a.started)},
                   {"seconds", std::chrono::duration<double>(a.lasted).count()},
                   {"ranks", std::move(ranks)},
                   {"log_errors", r.log_errors}};
  if (!r.sweep_error.empty()) j["sweep_error"] = r.sweep_error;
  if (!a.reason.empty()) j["reason"] = a.reason;
  if (r.signal) j["signal"] = cohort::signal_name(*r.signal);
  return j;
}

}  // namespace

std::string describe(const cohort::rank_failure& f, int first_rank) {
  auto text = fmt::format("rank {} (local {}, pid {}): {}", first_rank + f.rank, f.rank, f.pid, f.status);
  if (!f.message.empty()) text += ": " + f.message;
  if (!f.supervisor_error.empty()) text += ": " + f.supervisor_error;
  return text;
}

void print_summary(const run_record& run) {
  if (run.attempts.empty()) return;  // nothing ran: the error is told where it happened
  const auto& a = run.attempts.back();
  const auto& r = a.result;
  for (const auto& error : r.log_errors) say("cohort-run: the logs are incomplete: {}\n", error);
  if (!r.sweep_error.empty()) say("cohort-run: {}\n", r.sweep_error);
  // A shutdown signal that came as a failure's shutdown ran ends the run as
  // interrupted; the failure is still what went wrong, and is told.
  const bool failed_first = run.outcome == "interrupted" && !r.failures.empty();
  if (run.outcome != "failed" && !failed_first) return;
  if (failed_first) {
    say("cohort-run: a rank failed before the run was interrupted (role {}, run {}, attempt {})\n", run.role,
        run.run_id, a.attempt);
  } else if (run.failed_joining) {
    say("cohort-run: the run failed joining attempt {} (role {}, run {}, {} of {} restarts used)\n",
        *run.failed_joining, run.role, run.run_id, run.restarts, run.max_restarts);
    if (!run.message.empty()) say("  {}\n", run.message);
  } else {
    say("cohort-run: the run failed (role {}, run {}, attempt {}, {} of {} restarts used)\n", run.role,
        run.run_id, a.attempt, run.restarts, run.max_restarts);
    if (!run.message.empty()) say("  {}\n", run.message);
  }
  const auto* root = r.first_failure();
  if (root != nullptr) {
    // Joining failed: what is told below ended the attempt before.
    if (run.failed_joining) say("Attempt {} failed before it:\n", a.attempt);
    say("Root cause (first failure):\n");
    print_failure(*root, run, a);
  }
  bool header = false;
  for (const auto& f : r.failures) {
    if (&f == root) continue;
    if (!header) say("Other failures:\n");
    header = true;
    print_failure(f, run, a);
  }
  for (int rank : r.unreaped) {
    say("  rank {} could not be killed (stuck in the kernel): left behind\n", a.first_rank + rank);
  }
  if (!run.error_dir.empty()) say("The ranks' error files are kept in {}\n", run.error_dir.string());
  // Ranks write their redirected streams to the files themselves: a full
  // disk is then their failure, which only the file system can explain.
  struct statvfs fs {};
  if (!run.log_dir.empty() && ::statvfs(run.log_dir.c_str(), &fs) == 0 &&
      static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize < 64 * 1024) {
    say("The log folder {} is on a full file system (No space left on device): ranks writing their "
        "logs there fail\n", run.log_dir.string());
  }
}

std::string result_json(const run_record& run) {
  nlohmann::json attempts = nlohmann::json::array();
  for (const auto& a : run.attempts) attempts.push_back(attempt_json(a));
  nlohmann::json j{{"run_id", run.run_id},
                   {"role", run.role},
                   {"host", run.host},
                   {"rdzv_backend", run.rdzv_backend},
                   {"outcome", run.outcome},
                   {"exit_code", run.exit_code},
                   {"max_restarts", run.max_restarts},
                   {"restarts", run.restarts},
                   {"attempts", std::move(attempts)}};
  if (!run.message.empty()) j["message"] = run.message;
  if (!run.log_dir.empty()) j["log_dir"] = run.log_dir.string();
  if (!run.error_dir.empty()) j["error_dir"] = run.error_dir.string();
  return j.dump(2) + "\n";
}

void write_own_error_file(const run_record& run) {
  if (run.outcome != "failed" && run.outcome != "interrupted") return;
  const auto path = cohort::error_file_path();
  if (!path) return;
  const auto* root = run.attempts.empty() ? nullptr : run.attempts.back().result.first_failure();
  if (run.outcome == "failed" && run.message.empty() && root != nullptr) {
    if (root->message.empty()) return;  // the rank wrote no error file
    std::ifstream in(root->error_file);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const auto parse = [](const std::string& text) {
      return nlohmann::json::parse(cohort::detail::without_lone_surrogates(text), nullptr,
                                   /*allow_exceptions=*/false);
    };
    auto file = parse(text);
    if (file.is_discarded()) {
      // Not kept (see error_folder), or no longer readable: the report as
      // the supervisor read it, in torchelastic's shape, read back for its
      // errorCode below.
      if (!cohort::record_error(cohort::error_report{root->message, root->trace, root->timestamp})) {
        say("cohort-run: writing its error file {} failed\n", path->string());
        return;
      }
      std::ifstream written(*path);
      file = parse(std::string{std::istreambuf_iterator<char>(written), std::istreambuf_iterator<char>()});
      if (file.is_discarded()) return;
    }
    const int code = root->status.signaled() ? -root->status.signal() : root->status.code();
    if (code != 0 && file.is_object() && file.contains("message") && file["message"].is_object()) {
      file["message"]["errorCode"] = code;
    }
    std::ofstream out(*path, std::ios::trunc);
    out << file.dump() << '\n';
    if (!out.flush()) say("cohort-run: writing its error file {} failed\n", path->string());
    return;
  }
  const std::string what = run.message.empty() ? run.outcome : run.message;
  if (!cohort::record_error(cohort::error_report{"cohort-run: " + what, {}, std::nullopt})) {
    say("cohort-run: writing its error file {} failed\n", path->string());
  }
}

}  // namespace cohort_run
