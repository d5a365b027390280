// etcd's v3 JSON gateway through libcurl: each call is one POST of JSON, with
// keys and values in base64 and 64-bit numbers as strings, answered with JSON.
#include "run/etcd.hpp"

#include <curl/curl.h>
#include <dlfcn.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <mutex>
#include <type_traits>

namespace cohort_run {

namespace {

using nlohmann::json;

constexpr std::string_view base64_alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const auto n = static_cast<unsigned char>(bytes[i]) << 16 | static_cast<unsigned char>(bytes[i + 1]) << 8 |
                   static_cast<unsigned char>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += base64_alphabet[n >> shift & 63];
  }
  if (const auto rest = bytes.size() - i; rest > 0) {
    auto n = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) n |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += base64_alphabet[n >> 18 & 63];
    out += base64_alphabet[n >> 12 & 63];
    out += rest == 2 ? base64_alphabet[n >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

// Decodes base64 (padding optional); throws std::invalid_argument for any other character.
std::string base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned n = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const auto digit = base64_alphabet.find(c);
    if (digit == std::string_view::npos) throw std::invalid_argument("text that is not base64");
    n = n << 6 | static_cast<unsigned>(digit);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>(n >> bits & 0xff);
    }
  }
  return out;
}

// A 64-bit field of an answer: a string (as the gateway writes them), a
// number, or absent (the gateway leaves out zeros).
// Throws std::invalid_argument for anything else: a field of another type,
// or a string that is not a whole number.
std::int64_t number(const json& object, const char* name) {
  if (!object.is_object()) throw std::invalid_argument(fmt::format("not an object where '{}' was looked for", name));
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  const std::string text = it->is_string() ? it->get<std::string>() : std::string();
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!it->is_string() || text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw std::invalid_argument(fmt::format("'{}' is {}, not a whole number", name, it->dump()));
  }
  return value;
}

std::string bytes(const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) return std::string();
  if (!it->is_string()) throw std::invalid_argument(fmt::format("'{}' is {}, not base64 text", name, it->dump()));
  return base64_decode(it->get<std::string>());
}

// An object's array field, absent as empty.
const json& array_at(const json& object, const char* name) {
  static const json none = json::array();
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return none;
  if (!it->is_array()) throw std::invalid_argument(fmt::format("'{}' is {}, not an array", name, it->dump()));
  return *it;
}

const json& header_of(const json& answer) {
  static const json none = json::object();
  const auto it = answer.find("header");
  return it == answer.end() ? none : *it;
}

range_result range_from(const json& answer) {
  range_result r;
  r.revision = number(header_of(answer), "revision");
  for (const auto& kv : array_at(answer, "kvs")) {
    r.kvs.push_back({bytes(kv, "key"), bytes(kv, "value"), number(kv, "create_revision"),
                     number(kv, "mod_revision"), number(kv, "version"), number(kv, "lease")});
  }
  return r;
}

json key_range(std::string_view key, std::string_view range_end) {
  json j{{"key", base64_encode(key)}};
  if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
  return j;
}

json request_json(const request& r) {
  return std::visit(
      [](const auto& op) -> json {
        using op_type = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<op_type, put_request>) {
          json put{{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
          if (op.lease != 0) put["lease"] = std::to_string(op.lease);
          return {{"request_put", put}};
        } else if constexpr (std::is_same_v<op_type, range_request>) {
          return {{"request_range", key_range(op.key, op.range_end)}};
        } else {
          return {{"request_delete_range", key_range(op.key, op.range_end)}};
        }
      },
      r);
}

json compare_json(const compare& c) {
  json j = key_range(c.key, c.range_end);
  constexpr std::array<const char*, 4> relations{"EQUAL", "NOT_EQUAL", "LESS", "GREATER"};
  j["result"] = relations[static_cast<std::size_t>(c.is)];
  switch (c.what) {
    case compare::field::create_revision:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.number);
      break;
    case compare::field::mod_revision:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.number);
      break;
    case compare::field::version:
      j["target"] = "VERSION";
      j["version"] = std::to_string(c.number);
      break;
    case compare::field::value:
      j["target"] = "VALUE";
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

// The first line of `text`, cut to `limit` bytes ("..." after a cut), at
// the start of a UTF-8 character; a control byte (NUL, an escape) shows as
// \xNN, so that the line reaches the terminal as one readable line.
std::string first_line(std::string_view text, std::size_t limit) {
  auto line = text.substr(0, text.find_first_of("\r\n"));
  const bool cut = line.size() > limit;
  if (cut) {
    std::size_t end = limit;
    while (end > 0 && (static_cast<unsigned char>(line[end]) & 0xc0) == 0x80) --end;  // inside a character
    line = line.substr(0, end);
  }
  std::string shown;
  shown.reserve(line.size() + 3);
  for (const char c : line) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      shown += fmt::format("\\x{:02x}", byte);
    } else {
      shown += c;
    }
  }
  return cut ? shown + "..." : shown;
}

std::size_t append_to(char* data, std::size_t size, std::size_t count, void* text) {
  static_cast<std::string*>(text)->append(data, size * count);
  return size * count;
}

}  // namespace

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

compare compare::written_at(std::string key, std::int64_t revision) {
  compare c;
  c.key = std::move(key);
  c.what = field::mod_revision;
  c.number = revision;
  return c;
}

compare compare::unwritten_since(std::string key, std::string range_end, std::int64_t revision) {
  compare c = written_at(std::move(key), revision + 1);
  c.is = relation::less;
  c.range_end = std::move(range_end);
  return c;
}

namespace {

// libcurl, loaded when the first client is made: linked in, its thirty-odd
// libraries would be loaded by every cohort-run, etcd or not (about 3 ms of
// each start).
struct curl_library {
  decltype(&::curl_global_init) global_init = nullptr;
  decltype(&::curl_easy_init) easy_init = nullptr;
  decltype(&::curl_easy_cleanup) easy_cleanup = nullptr;
  decltype(&::curl_easy_setopt) easy_setopt = nullptr;
  decltype(&::curl_easy_perform) easy_perform = nullptr;
  decltype(&::curl_easy_getinfo) easy_getinfo = nullptr;
  decltype(&::curl_easy_strerror) easy_strerror = nullptr;
  decltype(&::curl_slist_append) slist_append = nullptr;
  decltype(&::curl_slist_free_all) slist_free_all = nullptr;
  std::string error;  // why it could not be loaded
};

const curl_library& curl() {
  static const curl_library library = [] {
    curl_library l;
    void* so = ::dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (so == nullptr) {
      l.error = std::string("libcurl could not be loaded (install libcurl4): ") + ::dlerror();
      return l;
    }
    const auto find = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(::dlsym(so, name));
      if (function == nullptr && l.error.empty()) l.error = std::string("libcurl.so.4 has no ") + name;
    };
    find(l.global_init, "curl_global_init");
    find(l.easy_init, "curl_easy_init");
    find(l.easy_cleanup, "curl_easy_cleanup");
    find(l.easy_setopt, "curl_easy_setopt");
    find(l.easy_perform, "curl_easy_perform");
    find(l.easy_getinfo, "curl_easy_getinfo");
    find(l.easy_strerror, "curl_easy_strerror");
    find(l.slist_append, "curl_slist_append");
    find(l.slist_free_all, "curl_slist_free_all");
    // curl_global_init is not safe to race with another thread's: here it
    // runs once, under the static's guard.
    if (l.error.empty()) l.global_init(CURL_GLOBAL_DEFAULT);
    return l;
  }();
  if (!library.error.empty()) throw etcd_error(library.error, 0);
  return library;
}

}  // namespace

// One easy handle, its headers and the text of its last error.
struct etcd_client::handle {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  std::array<char, CURL_ERROR_SIZE> error{};

  handle() {
    const auto& lib = cohort_run::curl();
    curl = lib.easy_init();
    if (curl == nullptr) throw std::runtime_error("curl_easy_init failed");
    headers = lib.slist_append(headers, "Content-Type: application/json");
    // No "Expect: 100-continue" round trip before larger bodies.
    headers = lib.slist_append(headers, "Expect:");
  }
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle() {
    const auto& lib = cohort_run::curl();
    lib.slist_free_all(headers);
    lib.easy_cleanup(curl);
  }
};

etcd_client::etcd_client(std::string endpoint, std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(std::max(timeout, std::chrono::milliseconds(1))),
      handle_(std::make_unique<handle>()) {}

etcd_client::~etcd_client() = default;
etcd_client::etcd_client(etcd_client&&) noexcept = default;
etcd_client& etcd_client::operator=(etcd_client&&) noexcept = default;

void etcd_client::timeout(std::chrono::milliseconds limit) noexcept {
  timeout_ = std::max(limit, std::chrono::milliseconds(1));
}

json etcd_client::post(std::string_view operation, std::string_view path, const json& body) {
  const auto fail = [&](const std::string& cause, int code = 0) {
    return etcd_error("etcd at " + endpoint_ + ": " + std::string(operation) + ": " + cause, code);
  };
  const std::string url = "http://" + endpoint_ + "/v3/" + std::string(path);
  const std::string text = body.dump();
  std::string answer;
  CURL* curl = handle_->curl;
  const auto& lib = cohort_run::curl();
  lib.easy_setopt(curl, CURLOPT_URL, url.c_str());
  lib.easy_setopt(curl, CURLOPT_HTTPHEADER, handle_->headers);
  lib.easy_setopt(curl, CURLOPT_POSTFIELDS, text.c_str());
  lib.easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
  lib.easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_to);
  lib.easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  lib.easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
  lib.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: other threads run
  lib.easy_setopt(curl, CURLOPT_NOPROXY, "*");  // etcd is reached directly, whatever http_proxy says
  lib.easy_setopt(curl, CURLOPT_ERRORBUFFER, handle_->error.data());
  handle_->error[0] = '\0';
  if (const CURLcode result = lib.easy_perform(curl); result != CURLE_OK) {
    std::string cause = handle_->error[0] != '\0' ? handle_->error.data() : lib.easy_strerror(result);
    // An answer that is no HTTP at all ("Received HTTP/0.9 when not
    // allowed", a status line no HTTP server writes): something else
    // listens there, and asking again will not make it etcd. A connection
    // refused, reset or timed out stays transient: etcd may be restarting.
    if (result == CURLE_UNSUPPORTED_PROTOCOL || result == CURLE_WEIRD_SERVER_REPLY) {
      throw fail(cause + " (the endpoint does not speak etcd's HTTP API: is it etcd's client URL?)",
                 etcd_error::unknown);
    }
    throw fail(cause);
  }
  long status = 0;
  lib.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  json parsed = json::parse(answer, nullptr, false);
  // An error answer: {"error": "...", "message": "...", "code": 5}; a
  // streaming call's (keepalive) error: {"error": {"message": ..., "grpc_code": ...}}.
  if (!parsed.is_discarded() && parsed.is_object() && parsed.contains("error")) {
    const json& error = parsed["error"].is_object() ? parsed["error"] : parsed;
    const int code = error.value("code", error.value("grpc_code", 0));
    throw fail(error.value("message", std::string("HTTP ") + std::to_string(status)),
               code == 0 ? etcd_error::unknown : code);
  }
  // Anything else (a web server's page, a proxy's error) is no answer of
  // etcd's: one line of it tells which server it is.
  if (status != 200 || parsed.is_discarded() || !parsed.is_object()) {
    const auto line = first_line(answer, 100);
    throw fail("HTTP " + std::to_string(status) + (line.empty() ? "" : ": " + line) +
                   " (the answer does not look like etcd's v3 JSON API: is the endpoint etcd's client URL?)",
               etcd_error::unknown);
  }
  return parsed;
}

template <class Decode>
auto etcd_client::call(std::string_view operation, std::string_view path, const json& body, Decode decode) {
  const json answer = post(operation, path, body);
  try {
    return decode(answer);
  } catch (const std::exception& e) {  // an answer of HTTP 200 in JSON, but not etcd's
    throw etcd_error(fmt::format("etcd at {}: {}: an answer that is not etcd's ({}): {}", endpoint_, operation,
                                 e.what(), answer.dump().substr(0, 200)),
                     etcd_error::unknown);
  }
}

range_result etcd_client::range(std::string_view key) {
  return call("range", "kv/range", key_range(key, {}), range_from);
}

range_result etcd_client::range_prefix(std::string_view prefix) {
  return call("range", "kv/range", key_range(prefix, prefix_end(prefix)), [&](const json& answer) {
    range_result r = range_from(answer);
    for (const auto& kv : r.kvs) {
      if (!kv.key.starts_with(prefix)) throw std::invalid_argument(fmt::format("a key outside '{}'", prefix));
    }
    return r;
  });
}

std::int64_t etcd_client::put(std::string_view key, std::string_view value, std::int64_t lease) {
  json body{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return call("put", "kv/put", body, [](const json& answer) { return number(header_of(answer), "revision"); });
}

std::int64_t etcd_client::erase(std::string_view key) {
  return call("delete", "kv/deleterange", key_range(key, {}), [](const json& answer) { return number(answer, "deleted"); });
}

std::int64_t etcd_client::erase_prefix(std::string_view prefix) {
  return call("delete", "kv/deleterange", key_range(prefix, prefix_end(prefix)),
              [](const json& answer) { return number(answer, "deleted"); });
}

txn_result etcd_client::txn(const std::vector<compare>& compares, const std::vector<request>& success,
                            const std::vector<request>& failure) {
  json body{{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : compares) body["compare"].push_back(compare_json(c));
  for (const auto& r : success) body["success"].push_back(request_json(r));
  for (const auto& r : failure) body["failure"].push_back(request_json(r));
  return call("txn", "kv/txn", body, [](const json& answer) {
    txn_result result;
    result.succeeded = answer.value("succeeded", false);
    result.revision = number(header_of(answer), "revision");
    for (const auto& response : array_at(answer, "responses")) {
      if (!response.is_object()) throw std::invalid_argument("a response that is not an object");
      if (const auto it = response.find("response_range"); it != response.end()) result.ranges.push_back(range_from(*it));
    }
    return result;
  });
}

lease etcd_client::grant_lease(std::chrono::seconds ttl) {
  return call("lease grant", "lease/grant", {{"TTL", std::to_string(ttl.count())}}, [](const json& answer) {
    const lease granted{number(answer, "ID"), std::chrono::seconds(number(answer, "TTL"))};
    if (granted.id == 0) throw std::invalid_argument("no lease ID");  // etcd's leases are never 0
    return granted;
  });
}

std::chrono::seconds etcd_client::keep_alive(std::int64_t id) {
  // A stream of one message: {"result": {"ID": ..., "TTL": ...}}; a lease
  // that is gone comes back without its TTL (or with "0").
  return call("lease keepalive", "lease/keepalive", {{"ID", std::to_string(id)}}, [](const json& answer) {
    const auto it = answer.find("result");
    return std::chrono::seconds(std::max<std::int64_t>(it == answer.end() ? 0 : number(*it, "TTL"), 0));
  });
}

bool etcd_client::revoke_lease(std::int64_t id) {
  try {
    post("lease revoke", "lease/revoke", {{"ID", std::to_string(id)}});
    return true;
  } catch (const etcd_error& e) {
    if (e.code() == etcd_error::not_found) return false;
    throw;
  }
}

}  // namespace cohort_run
