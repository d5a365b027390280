// A client of etcd's v3 JSON gateway (HTTP/1.1 POSTs to
// http://host:port/v3/...): the key-value, transaction and lease calls a
// rendezvous needs. Keys and values are bytes; the client encodes them.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cohort_run {

/// A call to etcd that failed: etcd could not be reached or answered late,
/// or it answered with an error. The message names the endpoint, the
/// operation and the cause ("etcd at 10.0.0.1:2379: range: Couldn't connect
/// to server").
class etcd_error : public std::runtime_error {
 public:
  /// gRPC status codes etcd answers with, those a caller tells apart.
  static constexpr int unknown = 2;          ///< also an answer that is not etcd's (a proxy, another server, no HTTP)
  static constexpr int not_found = 5;        ///< e.g. "requested lease not found"
  static constexpr int deadline_exceeded = 4;
  static constexpr int unavailable = 14;

  /// `code` is etcd's gRPC status code, or 0 when etcd did not answer.
  etcd_error(const std::string& what, int code) : std::runtime_error(what), code_(code) {}

  /// etcd's gRPC status code; 0 when etcd was not reached or did not answer in time.
  int code() const noexcept { return code_; }
  /// Whether the same call may succeed later: etcd was not reached, did not
  /// answer in time, or answered that it is unavailable.
  bool transient() const noexcept { return code_ == 0 || code_ == deadline_exceeded || code_ == unavailable; }

 private:
  int code_;
};

/// One key as etcd stores it.
struct key_value {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;  ///< the revision that created it: orders keys by creation
  std::int64_t mod_revision = 0;     ///< the revision that last changed it
  std::int64_t version = 0;          ///< how many times it was written since created
  std::int64_t lease = 0;            ///< the lease it lives under; 0 for none
};

/// The keys a range read, in key order, and the store's revision at the read.
struct range_result {
  std::int64_t revision = 0;
  std::vector<key_value> kvs;
};

/// A condition of a transaction on one key, or on every key of
/// [key, range_end) when range_end is set (a key that does not exist has
/// revisions and version 0, and no value to compare).
struct compare {
  enum class field { create_revision, mod_revision, version, value };
  enum class relation { equal, not_equal, less, greater };
  std::string key;
  field what = field::create_revision;
  relation is = relation::equal;
  std::int64_t number = 0;  ///< the revision or version compared with
  std::string value;        ///< the value compared with, for field::value
  std::string range_end;

  /// `key` was last written at `revision` (0: `key` does not exist).
  static compare written_at(std::string key, std::int64_t revision);
  /// No key of [key, range_end) was written after `revision`.
  static compare unwritten_since(std::string key, std::string range_end, std::int64_t revision);
};

/// Writes `value` at `key`, under `lease` (0: none).
struct put_request {
  std::string key;
  std::string value;
  std::int64_t lease = 0;
};
/// Reads `key`, or every key of [key, range_end) when range_end is set.
struct range_request {
  std::string key;
  std::string range_end;
};
/// Deletes `key`, or every key of [key, range_end) when range_end is set.
struct delete_request {
  std::string key;
  std::string range_end;
};
using request = std::variant<put_request, range_request, delete_request>;

/// Which branch a transaction took, and what its range requests read (one
/// entry per range_request of that branch, in order).
struct txn_result {
  bool succeeded = false;
  std::int64_t revision = 0;
  std::vector<range_result> ranges;
};

/// A lease etcd granted: its id and the time to live etcd gave it (etcd may
/// raise a short one to its minimum).
struct lease {
  std::int64_t id = 0;
  std::chrono::seconds ttl{0};
};

/// The end of the range of keys that begin with `prefix`: the prefix with
/// its last byte increased (bytes 0xff dropped first); "\0" (every key from
/// `prefix` on) when the prefix is all 0xff.
std::string prefix_end(std::string_view prefix);

/// One connection to one etcd endpoint. Every call blocks for at most the
/// client's timeout and throws etcd_error when it fails. A client is used by
/// one thread at a time: give each thread its own.
class etcd_client {
 public:
  /// `endpoint` is "host:port" of etcd's client URL (http). Contacts nothing yet.
  explicit etcd_client(std::string endpoint, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  ~etcd_client();
  etcd_client(etcd_client&&) noexcept;
  etcd_client& operator=(etcd_client&&) noexcept;

  const std::string& endpoint() const noexcept { return endpoint_; }
  /// How long each later call may take, connecting included (at least 1 ms).
  void timeout(std::chrono::milliseconds limit) noexcept;
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// The key `key` (none when absent).
  range_result range(std::string_view key);
  /// Every key that begins with `prefix`.
  range_result range_prefix(std::string_view prefix);
  /// Writes `value` at `key`, under `lease` (0: none); returns the new revision.
  std::int64_t put(std::string_view key, std::string_view value, std::int64_t lease = 0);
  /// Deletes `key`; returns how many keys were deleted (0 or 1).
  std::int64_t erase(std::string_view key);
  /// Deletes every key that begins with `prefix`; returns how many.
  std::int64_t erase_prefix(std::string_view prefix);
  /// Runs `success` when every comparison holds, `failure` otherwise, atomically.
  txn_result txn(const std::vector<compare>& compares, const std::vector<request>& success,
                 const std::vector<request>& failure = {});

  /// A new lease that expires `ttl` after its last keepalive.
  lease grant_lease(std::chrono::seconds ttl);
  /// Renews lease `id` once; returns its time to live, 0 when the lease no
  /// longer exists (it expired or was revoked).
  std::chrono::seconds keep_alive(std::int64_t id);
  /// Revokes lease `id`, deleting its keys; false when it did not exist.
  bool revoke_lease(std::int64_t id);

 private:
  struct handle;
  /// POSTs `body` to /v3/`path` and returns etcd's JSON answer; `operation` names the call in errors.
  nlohmann::json post(std::string_view operation, std::string_view path, const nlohmann::json& body);
  /// post()'s answer read by `decode`, whose exceptions (an answer in JSON
  /// that is not etcd's) become etcd_errors naming the endpoint, the call
  /// and the answer.
  template <class Decode>
  auto call(std::string_view operation, std::string_view path, const nlohmann::json& body, Decode decode);

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<handle> handle_;
};

}  // namespace cohort_run
