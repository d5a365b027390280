// The etcd client against a real etcd: bytes, prefixes, transactions,
// leases, and errors that say where and what.
#include "run/etcd.hpp"

#include "support/etcd_server.hpp"

#include <doctest/doctest.h>

#include <sys/socket.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>
#include <thread>

using namespace cohort_run;
using namespace std::chrono_literals;

using cohort::test::etcd;

namespace {

const cohort::test::needs_device needs{"etcd server", cohort::test::etcd_missing};

std::string with_every_byte() {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
  return bytes;
}

}  // namespace

TEST_SUITE("etcd client") {
  TEST_CASE("values of any bytes and length come back as written") {
    etcd_client client(etcd().endpoint());
    const std::string every = with_every_byte();
    for (std::size_t length : {0, 1, 2, 3, 4, 5, 256}) {
      const std::string key = "/bytes/" + std::to_string(length) + std::string(1, '\xff');
      const std::string value = every.substr(256 - length);
      client.put(key, value);
      const auto read = client.range(key);
      REQUIRE(read.kvs.size() == 1);
      CHECK(read.kvs[0].key == key);
      CHECK(read.kvs[0].value == value);
    }
  }

  TEST_CASE("a range of a missing key reads nothing, at the store's revision") {
    etcd_client client(etcd().endpoint());
    const auto revision = client.put("/missing/other", "x");
    const auto read = client.range("/missing/key");
    CHECK(read.kvs.empty());
    CHECK(read.revision >= revision);
  }

  TEST_CASE("a prefix range reads the keys that begin with it, in key order, and erase_prefix deletes them") {
    etcd_client client(etcd().endpoint());
    client.put("/prefix/b", "2");
    client.put("/prefix/a", "1");
    client.put("/prefix/c/d", "3");
    client.put("/prefiy", "outside");
    client.put("/prefix", "outside");
    const auto read = client.range_prefix("/prefix/");
    REQUIRE(read.kvs.size() == 3);
    CHECK(read.kvs[0].key == "/prefix/a");
    CHECK(read.kvs[1].key == "/prefix/b");
    CHECK(read.kvs[2].key == "/prefix/c/d");
    CHECK(read.kvs[1].create_revision < read.kvs[0].create_revision);
    CHECK(client.erase_prefix("/prefix/") == 3);
    CHECK(client.range_prefix("/prefix/").kvs.empty());
    CHECK(client.range("/prefiy").kvs.size() == 1);
    CHECK(client.erase("/prefiy") == 1);
    CHECK(client.erase("/prefiy") == 0);
  }

  TEST_CASE("the end of a prefix's range is the prefix with its last byte increased") {
    CHECK(prefix_end("/a/") == "/a0");
    CHECK(prefix_end("ab") == "ac");
    CHECK(prefix_end("a\xff\xff") == "b");
    CHECK(prefix_end("\xff") == std::string(1, '\0'));
  }

  TEST_CASE("a transaction runs its success branch while its comparisons hold, its failure branch after") {
    etcd_client client(etcd().endpoint());
    const auto create_once = [&](const std::string& value) {
      return client.txn({compare::written_at("/txn/once", 0)}, {put_request{"/txn/once", value}},
                        {range_request{"/txn/once", {}}});
    };
    const auto first = create_once("first");
    CHECK(first.succeeded);
    CHECK(first.ranges.empty());
    const auto second = create_once("second");
    CHECK_FALSE(second.succeeded);
    REQUIRE(second.ranges.size() == 1);
    REQUIRE(second.ranges[0].kvs.size() == 1);
    CHECK(second.ranges[0].kvs[0].value == "first");

    // A comparison over a range fails once a key of it is written after the revision.
    const auto revision = client.put("/txn/range/a", "1");
    const auto unchanged = compare::unwritten_since("/txn/range/", prefix_end("/txn/range/"), revision);
    CHECK(client.txn({unchanged}, {put_request{"/txn/other", "x"}}).succeeded);
    client.put("/txn/range/b", "2");
    CHECK_FALSE(client.txn({unchanged}, {put_request{"/txn/other", "y"}}).succeeded);

    compare value_is;
    value_is.key = "/txn/once";
    value_is.what = compare::field::value;
    value_is.value = "first";
    CHECK(client.txn({value_is}, {delete_request{"/txn/once", {}}}).succeeded);
    CHECK(client.range("/txn/once").kvs.empty());
  }

  TEST_CASE("keys under a lease live while it is kept alive and go when it is revoked") {
    etcd_client client(etcd().endpoint());
    const auto granted = client.grant_lease(1s);
    CHECK(granted.id != 0);
    CHECK(granted.ttl >= 1s);
    client.put("/lease/key", "v", granted.id);
    CHECK(client.range("/lease/key").kvs.at(0).lease == granted.id);
    for (int i = 0; i < 4; ++i) {  // twice the time to live
      std::this_thread::sleep_for(500ms);
      CHECK(client.keep_alive(granted.id) >= 1s);
    }
    CHECK(client.range("/lease/key").kvs.size() == 1);
    CHECK(client.revoke_lease(granted.id));
    CHECK(client.range("/lease/key").kvs.empty());
    CHECK(client.keep_alive(granted.id) == 0s);
    CHECK_FALSE(client.revoke_lease(granted.id));
  }

  TEST_CASE("a put under a lease that does not exist fails with etcd's reason") {
    etcd_client client(etcd().endpoint());
    try {
      client.put("/lease/none", "v", 0x7777);
      FAIL("the put succeeded");
    } catch (const etcd_error& e) {
      CHECK(e.code() == etcd_error::not_found);
      CHECK_FALSE(e.transient());
      CHECK(std::string(e.what()) == "etcd at " + etcd().endpoint() + ": put: etcdserver: requested lease not found");
    }
  }

  TEST_CASE("a call to a closed port fails at once, naming the endpoint, the call and the cause") {
    const auto endpoint = "127.0.0.1:" + std::to_string(cohort_run::free_port());
    etcd_client client(endpoint, 30s);
    const auto start = std::chrono::steady_clock::now();
    try {
      client.range("/any");
      FAIL("the range succeeded");
    } catch (const etcd_error& e) {
      const std::string what = e.what();
      CHECK(what.starts_with("etcd at " + endpoint + ": range: "));
      CHECK(what.find("Couldn't connect to server") != std::string::npos);
      CHECK(e.code() == 0);
      CHECK(e.transient());
    }
    CHECK(std::chrono::steady_clock::now() - start < 10s);  // at once, not after the 30 s timeout
  }

  TEST_CASE("a call to a server that speaks no HTTP fails at once, for good, saying it is not etcd's API") {
    cohort::test::ssh_like_server ssh;
    etcd_client client(ssh.endpoint(), 30s);
    try {
      client.range("/any");
      FAIL("the range succeeded");
    } catch (const etcd_error& e) {
      const std::string what = e.what();
      CHECK(what.starts_with("etcd at " + ssh.endpoint() + ": range: "));
      CHECK(what.find("the endpoint does not speak etcd's HTTP API") != std::string::npos);
      CHECK(e.code() == etcd_error::unknown);
      CHECK_FALSE(e.transient());  // asking again would not make it etcd
    }
  }

  // Before, the whole page came after "HTTP 501: ", a dozen lines of HTML.
  TEST_CASE("a web server's error page fails for good in one line, saying it does not look like etcd's v3 JSON API") {
    const std::string page =
        "<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>\n        <title>Error response</title>\n    </head>\n"
        "    <body>\n        <h1>Error response</h1>\n        <p>Error code: 501</p>\n    </body>\n</html>\n";
    cohort::test::canned_server web("HTTP/1.0 501 Unsupported method ('POST')\r\nContent-Type: text/html\r\n"
                                    "Content-Length: " + std::to_string(page.size()) + "\r\n\r\n" + page);
    etcd_client client(web.endpoint(), 30s);
    try {
      client.grant_lease(5s);
      FAIL("the grant succeeded");
    } catch (const etcd_error& e) {
      const std::string what = e.what();
      CHECK(what == "etcd at " + web.endpoint() +
                        ": lease grant: HTTP 501: <!DOCTYPE HTML> (the answer does not look like etcd's v3 JSON API: is "
                        "the endpoint etcd's client URL?)");
      CHECK(e.code() == etcd_error::unknown);
      CHECK_FALSE(e.transient());
    }
  }

  TEST_CASE("a long first line of an answer that is not etcd's is cut") {
    cohort::test::canned_server web("HTTP/1.0 404 Not Found\r\nContent-Length: 300\r\n\r\n" + std::string(300, 'x'));
    etcd_client client(web.endpoint(), 30s);
    CHECK_THROWS_WITH_AS(client.range("/any"),
                         ("etcd at " + web.endpoint() + ": range: HTTP 404: " + std::string(100, 'x') +
                          "... (the answer does not look like etcd's v3 JSON API: is the endpoint etcd's client URL?)")
                             .c_str(),
                         etcd_error);
  }

  // Before, the cut could split a character in two, and control bytes
  // went out raw: an escape sequence reached the terminal, and a NUL ended
  // the message before its hint.
  TEST_CASE("an answer that is not etcd's is cut between characters, its control bytes shown as \\xNN") {
    const std::string accents = "a" + [] {
      std::string e;
      for (int i = 0; i < 60; ++i) e += "\xc3\xa9";  // é, two bytes each
      return e;
    }();
    cohort::test::canned_server accented("HTTP/1.0 502 Bad Gateway\r\nContent-Length: " + std::to_string(accents.size()) +
                                         "\r\n\r\n" + accents);
    etcd_client first(accented.endpoint(), 30s);
    try {
      first.range("/any");
      FAIL("the range succeeded");
    } catch (const etcd_error& e) {
      const std::string what = e.what();
      const auto cut = what.find("...");
      REQUIRE(cut != std::string::npos);
      // 'a' and then whole two-byte characters only.
      const auto body = what.substr(0, cut).substr(what.find("HTTP 502: ") + 10);
      CHECK(body.size() % 2 == 1);
      CHECK(body.substr(1) == accents.substr(1, body.size() - 1));
    }
    const char raw[] = "\x1b[31mred\x1b[0m\tx\0tail";
    const std::string controls(raw, sizeof raw - 1);
    cohort::test::canned_server controlled("HTTP/1.0 502 Bad Gateway\r\nContent-Length: " +
                                           std::to_string(controls.size()) + "\r\n\r\n" + controls);
    etcd_client second(controlled.endpoint(), 30s);
    try {
      second.range("/any");
      FAIL("the range succeeded");
    } catch (const etcd_error& e) {
      const std::string what = e.what();
      CHECK(what.find('\x1b') == std::string::npos);
      CHECK(what.find("\\x1b[31mred") != std::string::npos);
      CHECK(what.find("\\x00tail") != std::string::npos);
      CHECK(what.find("does not look like etcd's v3 JSON API") != std::string::npos);
    }
  }

  // Before, a field of the wrong type or a number that was not one escaped
  // as nlohmann's or std::stoll's bare exception, a key outside the prefix
  // as an out_of_range of the rendezvous, and an answer of {} was a lease.
  TEST_CASE("an answer in JSON that is not etcd's fails for good, naming the endpoint, the call and the answer") {
    struct case_of {
      const char* answer;
      const char* why;
      std::function<void(etcd_client&)> call;
    };
    const std::vector<case_of> cases{
        {R"({"header":{"revision":"x"},"ID":"zz","TTL":"abc"})", "'ID' is \"zz\", not a whole number",
         [](etcd_client& c) { c.grant_lease(5s); }},
        {"{}", "no lease ID", [](etcd_client& c) { c.grant_lease(5s); }},
        {R"({"header":{"revision":"7"},"kvs":"oops"})", "'kvs' is \"oops\", not an array",
         [](etcd_client& c) { c.range_prefix("/run/"); }},
        {R"({"kvs":[{"key":"L290aGVy"}]})", "a key outside '/run/'", [](etcd_client& c) { c.range_prefix("/run/"); }},
        {R"({"kvs":[{"key":7}]})", "'key' is 7, not base64 text", [](etcd_client& c) { c.range("/run/a"); }},
        {R"({"header":{"revision":"12x"}})", "'revision' is \"12x\", not a whole number",
         [](etcd_client& c) { c.put("/run/a", "v"); }},
        {R"({"responses":{}})", "'responses' is {}, not an array", [](etcd_client& c) { c.txn({}, {}, {}); }},
        {R"({"result":[]})", "not an object where 'TTL' was looked for", [](etcd_client& c) { c.keep_alive(1); }},
    };
    for (const auto& c : cases) {
      CAPTURE(c.answer);
      cohort::test::json_server server(c.answer);
      etcd_client client(server.endpoint(), 30s);
      try {
        c.call(client);
        FAIL("the call succeeded");
      } catch (const etcd_error& e) {
        const std::string what = e.what();
        CHECK(what.starts_with("etcd at " + server.endpoint() + ": "));
        CHECK(what.find(std::string("an answer that is not etcd's (") + c.why + ")") != std::string::npos);
        CHECK(e.code() == etcd_error::unknown);
        CHECK_FALSE(e.transient());
      }
    }
  }

  TEST_CASE("a call to a server that does not answer fails after the client's timeout") {
    // Listening, never accepting: the connection is made, no answer comes.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 8) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0);
    etcd_client client("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), 300ms);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(client.grant_lease(5s), doctest::Contains("timed out"), etcd_error);
    // It waited for the answer (curl's clock may end it a little before
    // ours says 300 ms), and no longer than a generous bound.
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 200ms);
    CHECK(took < 5s);
    ::close(fd);
  }
}
