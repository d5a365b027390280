// The etcd rendezvous: one read of the job's keys per poll, and
// transactions that hold only on the state they were decided from
// (rendezvous.hpp describes the keys and the rounds).
#include "run/rendezvous.hpp"

#include "run/port.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <set>
#include <utility>

namespace cohort_run {

namespace {

using nlohmann::json;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Sleeps for `period` or until `stop` is requested; false when it was.
bool sleep_unless_stopped(std::stop_token stop, milliseconds period) {
  std::mutex m;
  std::condition_variable_any woken;
  std::unique_lock lock(m);
  woken.wait_for(lock, stop, period, [] { return false; });
  return !stop.stop_requested();
}

// `d` in seconds, for messages: "0.5 s".
std::string seconds_text(milliseconds d) {
  std::string text = std::to_string(d.count() / 1000);
  if (const auto rest = d.count() % 1000; rest != 0) {
    std::string fraction = std::to_string(1000 + rest).substr(1);
    fraction.erase(fraction.find_last_not_of('0') + 1);
    text += "." + fraction;
  }
  return text + " s";
}

milliseconds until(clock_type::time_point deadline) {
  return std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - clock_type::now()));
}

// Why another member's keys went: its lease ended, which etcd does alike
// for a node that revoked it as it was stopped and for one it stopped
// hearing from; this node cannot tell which.
constexpr const char* lease_gone = "its lease ended (the node was stopped, or etcd stopped hearing from it)";

std::string nodes_text(std::size_t n) { return std::to_string(n) + (n == 1 ? " node" : " nodes"); }

// MIN:MAX as --nnodes gives it: N where both are N.
std::string nnodes_text(int min_nodes, int max_nodes) {
  return std::to_string(min_nodes) + (min_nodes == max_nodes ? "" : ":" + std::to_string(max_nodes));
}

}  // namespace

// What one read of the job's keys shows, of the current round only.
struct etcd_rendezvous::snapshot {
  std::int64_t revision = 0;  ///< the store's, at the read
  std::optional<std::string> closed;
  std::optional<std::string> finished;  ///< why the job finished
  std::int64_t finished_round = 0;      ///< the round it finished in
  std::optional<std::string> nnodes;    ///< the job's --nnodes, as the node that made the state gave it
  bool has_state = false;
  std::int64_t state_revision = 0;  ///< the state key's mod revision
  std::int64_t round = 0;
  bool running = false;
  std::string why;              ///< why the round was opened
  std::string cause;            ///< "lost" when a node was lost, "joining" for a newcomer, else empty
  std::vector<member> listed;   ///< running: the frozen list
  std::vector<member> joined;   ///< live member keys of the round, by creation
  std::set<std::string> done;   ///< members of the round that finished
  std::set<std::string> confirmed;  ///< members of the running round that confirmed it
  std::set<std::string> waiting;

  bool has_joined(const std::string& id) const {
    return std::any_of(joined.begin(), joined.end(), [&](const member& m) { return m.id == id; });
  }
  bool lists(const std::string& id) const {
    return std::any_of(listed.begin(), listed.end(), [&](const member& m) { return m.id == id; });
  }
  /// A listed member whose lease went before it finished: a node lost.
  bool gone(const member& m) const { return !has_joined(m.id) && !done.contains(m.id); }
  std::string finished_text() const { return "the job has finished: " + *finished; }
};

// Where next_round stands, across its polls.
struct etcd_rendezvous::progress {
  bool wrote = false;       ///< the step wrote: read again at once
  milliseconds pace{0};     ///< else the wait before the next read
  std::int64_t round = -1;  ///< the round min_reached is counted in
  bool min_joined = false;  ///< min_nodes have joined it, since min_reached
  clock_type::time_point min_reached;
  std::int64_t confirmed_round = -1;  ///< the running round this node confirmed
  clock_type::time_point confirmed_at;
  bool joined = false;  ///< this node joined a round in this call
  std::string waited;   ///< how this node waited beside a running round since it last joined one, for the message of
                        ///< the job's end
  std::string text = "etcd was not read";  ///< for the message of a timeout
};

etcd_rendezvous::etcd_rendezvous(rendezvous_config config)
    : config_(std::move(config)), prefix_("/cohort/rdzv/" + config_.run_id + "/"),
      client_(config_.endpoint, config_.request_timeout) {
  if (config_.endpoint.empty()) throw std::invalid_argument("rendezvous: no etcd endpoint");
  if (config_.run_id.empty() || config_.run_id.find('/') != std::string::npos) {
    throw std::invalid_argument("rendezvous: a run id must be non-empty and without '/': '" + config_.run_id + "'");
  }
  if (config_.min_nodes < 1 || config_.max_nodes < config_.min_nodes) {
    throw std::invalid_argument("rendezvous: nodes " + std::to_string(config_.min_nodes) + ":" +
                                std::to_string(config_.max_nodes) + " is no range of at least one node");
  }
  if (config_.nproc < 1) throw std::invalid_argument("rendezvous: a node needs at least one rank");
  if (config_.local_addr.empty()) throw std::invalid_argument("rendezvous: no local address");
  if (config_.lease_ttl <= milliseconds(0) || config_.poll_interval <= milliseconds(0) ||
      config_.request_timeout <= milliseconds(0)) {
    throw std::invalid_argument("rendezvous: lease_ttl, poll_interval and request_timeout must be positive");
  }
}

etcd_rendezvous::~etcd_rendezvous() {
  unwatch();
  keeper_ = {};  // stops and joins it
  if (lease_ != 0) {
    try {
      client_.timeout(milliseconds(1000));
      client_.revoke_lease(lease_);
    } catch (const etcd_error&) {
      // Unreachable: the lease expires on its own.
    }
  }
}

std::string etcd_rendezvous::where() const {
  return "rendezvous of job '" + config_.run_id + "' at " + config_.endpoint;
}

std::string etcd_rendezvous::node_id() const {
  char text[17];
  const auto id = static_cast<std::uint64_t>(lease_);
  return {text, std::to_chars(text, text + sizeof text, id, 16).ptr};
}

etcd_rendezvous::snapshot etcd_rendezvous::read(etcd_client& client) const {
  const auto all = client.range_prefix(prefix_);
  snapshot s;
  s.revision = all.revision;
  // Member keys, by round: only the state's round counts, known once all is read.
  struct round_key {
    enum kind { joined, confirmed, done };
    std::int64_t round;
    kind what;
    member who;
    std::int64_t created;
  };
  std::vector<round_key> round_keys;
  for (const auto& kv : all.kvs) {
    const std::string_view name = std::string_view(kv.key).substr(prefix_.size());
    if (name == "closed") {
      s.closed = kv.value;
    } else if (name == "nnodes") {
      s.nnodes = kv.value;
    } else if (name == "finished") {
      const json finished = json::parse(kv.value, nullptr, false);
      s.finished = finished.is_object() ? finished.value("why", std::string()) : kv.value;
      s.finished_round = finished.is_object() ? finished.value("round", std::int64_t{-1}) : -1;
    } else if (name == "state") {
      const json state = json::parse(kv.value, nullptr, false);
      if (!state.is_object()) throw rendezvous_error(where() + ": the state key holds no JSON object: " + kv.value);
      s.has_state = true;
      s.state_revision = kv.mod_revision;
      s.round = state.value("round", std::int64_t{0});
      s.running = state.value("phase", std::string()) == "running";
      s.why = state.value("why", std::string());
      s.cause = state.value("cause", std::string());
      for (const auto& m : state.value("members", json::array())) {
        s.listed.push_back({m.value("id", std::string()), m.value("addr", std::string()), m.value("port", 0),
                            m.value("nproc", 1)});
      }
    } else if (name.starts_with("w/")) {
      s.waiting.insert(std::string(name.substr(2)));
    } else if (name.starts_with("r/")) {
      // r/<N>/m/<id>, r/<N>/ok/<id> or r/<N>/done/<id>
      const auto rest = name.substr(2);
      std::int64_t round = 0;
      const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), round);
      const std::string_view tail(end, static_cast<std::size_t>(rest.data() + rest.size() - end));
      if (error != std::errc()) continue;
      if (tail.starts_with("/m/")) {
        const json value = json::parse(kv.value, nullptr, false);
        if (!value.is_object()) continue;
        round_keys.push_back({round, round_key::joined,
                              {std::string(tail.substr(3)), value.value("addr", std::string()), value.value("port", 0),
                               value.value("nproc", 1)},
                              kv.create_revision});
      } else if (tail.starts_with("/ok/")) {
        round_keys.push_back(
            {round, round_key::confirmed, {std::string(tail.substr(4)), {}, 0, 0}, kv.create_revision});
      } else if (tail.starts_with("/done/")) {
        round_keys.push_back({round, round_key::done, {std::string(tail.substr(6)), {}, 0, 0}, kv.create_revision});
      }
    }
  }
  std::sort(round_keys.begin(), round_keys.end(),
            [](const round_key& a, const round_key& b) { return a.created < b.created; });
  for (auto& k : round_keys) {
    if (k.round != s.round) continue;
    if (k.what == round_key::done) {
      s.done.insert(k.who.id);
    } else if (k.what == round_key::confirmed) {
      s.confirmed.insert(k.who.id);
    } else {
      s.joined.push_back(std::move(k.who));
    }
  }
  return s;
}

void etcd_rendezvous::ensure_lease() {
  if (lease_ != 0 && !lease_lost_.load(std::memory_order_relaxed)) return;
  keeper_ = {};
  const auto ttl = std::max<std::int64_t>(1, (config_.lease_ttl.count() + 999) / 1000);
  const auto asked = clock_type::now();
  const auto granted = client_.grant_lease(std::chrono::seconds(ttl));
  lease_ = granted.id;
  unanswered_ms_.store(0, std::memory_order_relaxed);
  lease_lost_.store(false, std::memory_order_relaxed);
  keeper_ = std::jthread([this, id = granted.id, expires = asked + granted.ttl](std::stop_token stop) {
    keep_alive(stop, id, expires);
  });
}

void etcd_rendezvous::keep_alive(std::stop_token stop, std::int64_t lease, clock_type::time_point expires) {
  // `expires` is the least the lease lives, as this node knows: its time to
  // live from when the request etcd last answered (the grant, or a renewal)
  // was sent. It says when to renew first: a step (a twelfth of the lease)
  // from now, or a step before `expires` where that is sooner (at once
  // after a grant that took most of the lease); each try after comes a
  // step after the one before. It does not say the lease is gone: etcd
  // counts from when it took the request, later. A try waits for etcd's
  // answer as long as the lease may live (until `expires`, and at least a
  // step), and the next goes at once where the answer came late.
  // The lease is lost when etcd says so (a time to live of 0, or no such
  // lease), or when a try went unanswered and `expires` has passed. A try
  // that fails at once (a refused connection) is tried again a step later.
  // An outage shorter than the lease less two steps leaves it alive: the
  // try sent as it began is answered as it ends (etcd frozen), or one sent
  // within a step of its end is (connections refused).
  const auto step = std::max(config_.lease_ttl / 12, milliseconds(100));
  etcd_client client(config_.endpoint, step);
  // When the first try etcd did not answer was sent; max while it answers.
  auto failing_since = clock_type::time_point::max();
  for (auto next = std::min(clock_type::now() + step, expires - step); sleep_unless_stopped(stop, until(next));) {
    const auto sent = clock_type::now();
    next = sent + step;
    client.timeout(std::max(step, until(expires)));
    try {
      const auto ttl = client.keep_alive(lease);
      if (ttl == std::chrono::seconds(0)) break;  // expired, or revoked
      expires = sent + ttl;
      failing_since = clock_type::time_point::max();
    } catch (const std::exception& e) {
      // etcd unreachable, or an answer that does not parse; or etcd's word
      // that the lease is gone.
      const auto* answer = dynamic_cast<const etcd_error*>(&e);
      if (answer != nullptr && answer->code() == etcd_error::not_found) break;
      failing_since = std::min(failing_since, sent);
      if (clock_type::now() >= expires) break;  // etcd may have let it expire
    }
  }
  if (stop.stop_requested()) return;
  if (const auto now = clock_type::now(); failing_since < now) {
    unanswered_ms_.store(std::chrono::duration_cast<milliseconds>(now - failing_since).count(),
                         std::memory_order_relaxed);
  }
  lease_lost_.store(true, std::memory_order_release);
}

bool etcd_rendezvous::open_round(std::int64_t after, std::int64_t seen_revision, const std::string& why,
                                 round_change::cause what, std::vector<compare> also) {
  // What ended the round goes with the new one: every node counts a lost
  // node alike, whichever of them saw it first.
  using cause = round_change::cause;
  const char* cause_name = what == cause::member_lost || what == cause::lease_lost ? "lost"
                           : what == cause::node_waiting                          ? "joining"
                                                                                  : "";
  const json state{{"round", after + 1}, {"phase", "joining"}, {"why", why}, {"cause", cause_name}};
  also.push_back(compare::written_at(prefix_ + "state", seen_revision));
  also.push_back(compare::written_at(prefix_ + "finished", 0));
  return client_
      .txn(also,
           {put_request{prefix_ + "state", state.dump()}, delete_request{prefix_ + "r/", prefix_end(prefix_ + "r/")}})
      .succeeded;
}

assignment etcd_rendezvous::next_round(const std::function<bool(milliseconds)>& pause) {
  unwatch();
  const auto wait_between_polls = pause ? pause : [](milliseconds d) {
    std::this_thread::sleep_for(d);
    return true;
  };
  const auto deadline = clock_type::now() + config_.join_timeout;
  std::optional<etcd_error> unreachable;  // etcd's last transient failure, while it lasts
  bool answered = false;                  // etcd was read in this round
  progress p;
  try {
    for (;;) {
      const auto left = until(deadline);
      if (left == milliseconds(0)) {
        if (unreachable) {
          throw rendezvous_error(where() + ": etcd unreachable until join_timeout (" +
                                 seconds_text(config_.join_timeout) + "): " + unreachable->what());
        }
        throw rendezvous_error(where() + ": no round formed within join_timeout (" +
                               seconds_text(config_.join_timeout) + "): " + p.text);
      }
      const auto request_timeout = std::min(config_.request_timeout, left);
      client_.timeout(request_timeout);
      p.wrote = false;
      p.pace = std::min(config_.poll_interval, rendezvous_pace);
      try {
        ensure_lease();
        const auto s = read(client_);
        unreachable.reset();
        answered = true;
        if (auto placed = step(s, p)) {
          client_.timeout(config_.request_timeout);
          return *placed;
        }
      } catch (const etcd_error& e) {
        if (e.code() == etcd_error::not_found) {
          lease_lost_.store(true, std::memory_order_relaxed);  // this node's lease expired: grant another
          p.wrote = true;
        } else if (e.transient()) {
          // A request cut short by join_timeout's end says nothing of etcd:
          // once etcd has answered in this round, what the round came to is
          // the better reason; before, the failure of a whole request is
          // (a host that does not resolve, a refused connection), and the
          // cut one's only where none came before it.
          const bool cut = request_timeout < config_.request_timeout;
          if (!cut || (!answered && !unreachable)) unreachable = e;
        } else {
          throw rendezvous_error(where() + ": " + e.what());
        }
      }
      const auto wait = p.wrote ? milliseconds(0) : std::min(p.pace, until(deadline));
      if (!wait_between_polls(wait)) {
        throw rendezvous_error(where() + ": interrupted while waiting for a round");
      }
    }
  } catch (const rendezvous_error&) {
    // Out of the rendezvous: this node's keys go with its lease, so that no
    // round counts it.
    keeper_ = {};
    if (const auto lease = std::exchange(lease_, 0); lease != 0) {
      try {
        client_.timeout(std::min(config_.request_timeout, milliseconds(1000)));
        client_.revoke_lease(lease);
      } catch (const etcd_error&) {
      }
    }
    client_.timeout(config_.request_timeout);
    throw;
  }
}

std::optional<assignment> etcd_rendezvous::step(const snapshot& s, progress& p) {
  const auto self = node_id();
  // Listed in the running round, and not yet placed in it: this node
  // confirms it, and is placed once every member has. A member of the round
  // that finished runs it even when another member's ranks succeeded before
  // it saw every confirmation; once it ran it, it is told the job has
  // finished.
  const bool listed_unplaced = s.running && s.lists(self) && !(placed_ && placed_->round == s.round);
  const auto nnodes = nnodes_text(config_.min_nodes, config_.max_nodes);
  if (s.closed || (s.finished && !(listed_unplaced && s.finished_round == s.round))) {
    throw rendezvous_error(where() + ": " + (s.closed ? "the job was closed: " + *s.closed : s.finished_text()) +
                           ended_for(s, p));
  }
  // Before any write: a node of another job's size would re-form its rounds.
  if (s.nnodes && *s.nnodes != nnodes) {
    throw rendezvous_error(where() + ": this node runs with --nnodes " + nnodes + " and the job with --nnodes " +
                           *s.nnodes + " (every node of a job gives the same)");
  }
  const auto state_unchanged = compare::written_at(prefix_ + "state", s.state_revision);
  p.wrote = true;
  if (!s.has_state) {
    const json first{{"round", 0}, {"phase", "joining"}, {"why", "the job's first round"}};
    client_.txn({state_unchanged},
                {put_request{prefix_ + "state", first.dump()}, put_request{prefix_ + "nnodes", nnodes}});
  } else if (!s.running && !s.has_joined(self)) {
    // A port free now, as torchrun picks one at each rendezvous: one picked
    // as the job began may be another program's by a later round.
    const int port = config_.local_port != 0 ? config_.local_port : free_port();
    const json me{{"addr", config_.local_addr}, {"port", port}, {"nproc", config_.nproc}};
    client_.txn({state_unchanged}, {put_request{member_prefix(s.round) + self, me.dump(), lease_},
                                    delete_request{prefix_ + "w/" + self, {}}});
    p.joined = true;
    p.waited.clear();
  } else if (!s.running) {
    p.wrote = close_when_due(s, p);
  } else if (listed_unplaced) {
    return confirm(s, p);
  } else if (s.lists(self)) {
    // The round this node ran: it asks for the next one.
    p.wrote = ended_by_ ? open_round(s.round, s.state_revision, ended_by_->reason, ended_by_->what)
                        : open_round(s.round, s.state_revision, config_.local_addr + " asks for a new round");
  } else {
    // Running without this node: it waits for the next round, which the
    // members open when they see it waiting, or it opens itself when no
    // member is left running.
    const bool members_left = std::any_of(s.listed.begin(), s.listed.end(),
                                          [&](const member& m) { return s.has_joined(m.id) && !s.done.contains(m.id); });
    const auto round = "round " + std::to_string(s.round);
    const bool full = s.listed.size() >= static_cast<std::size_t>(config_.max_nodes);
    p.text = full ? round + " is full, with " + nodes_text(s.listed.size()) + " (--nnodes " + nnodes +
                        "), and did not end"
                  : round + " ran with " + nodes_text(s.listed.size()) + " and did not end";
    p.waited = full ? "this node had no place: " + round + " is full, with " + nodes_text(s.listed.size()) +
                          " (--nnodes " + nnodes + ")"
                    : "this node waited for the round after " + round;
    if (!members_left) {
      p.wrote = open_round(s.round, s.state_revision,
                           config_.local_addr + " joins, and no node of round " + std::to_string(s.round) + " is left");
    } else {
      p.wrote = false;
      // Beside a full round, nothing but its end lets this node in: it reads
      // at its own poll_interval meanwhile, as the round's watches do.
      if (full) p.pace = config_.poll_interval;
      if (!s.waiting.contains(self)) client_.put(prefix_ + "w/" + self, config_.local_addr, lease_);
    }
  }
  return std::nullopt;
}

std::optional<assignment> etcd_rendezvous::confirm(const snapshot& s, progress& p) {
  using cause = round_change::cause;
  const auto self = node_id();
  const auto round = std::to_string(s.round);
  const auto node_text = [&](std::size_t i) {
    return "node " + std::to_string(i) + " (" + s.listed[i].addr + ")";
  };
  const auto place = [&] {
    // Its waiting key went in the transaction that made it a member: no
    // request is left that could fail once it is placed.
    placed_ = placement{s.round, s.state_revision, self, s.listed};
    ended_by_.reset();
    return assignment_of(self, s);
  };
  // A member's ranks succeeded in this round: that member was placed, so
  // every member had confirmed it, and the round is the job's last. This
  // node runs it too, whatever became of the others since: one lost counts
  // as done, as it would had this node seen every confirmation in time
  // (no round opens after a finished one).
  if (s.finished && s.finished_round == s.round) return place();
  // A member whose lease went (a node killed as it joined): no node started
  // its ranks without its confirmation, and none counts it as a restart of
  // its own; a node that did, after every member confirmed, counts it as
  // lost.
  for (std::size_t i = 0; i < s.listed.size(); ++i) {
    if (s.gone(s.listed[i])) {
      p.wrote = open_round(s.round, s.state_revision,
                           node_text(i) + " left before round " + round + " began: " + lease_gone,
                           cause::member_lost);
      return std::nullopt;
    }
  }
  if (!s.confirmed.contains(self)) {
    // Under this node's lease: a confirmation goes with the node.
    client_.txn({compare::written_at(prefix_ + "state", s.state_revision)},
                {put_request{prefix_ + "r/" + round + "/ok/" + self, "ok", lease_}});
    p.confirmed_round = s.round;
    p.confirmed_at = clock_type::now();
    return std::nullopt;
  }
  std::optional<std::size_t> unconfirmed;
  for (std::size_t i = 0; i < s.listed.size() && !unconfirmed; ++i) {
    if (!s.confirmed.contains(s.listed[i].id) && !s.done.contains(s.listed[i].id)) unconfirmed = i;
  }
  if (!unconfirmed) return place();
  if (p.confirmed_round != s.round) {  // confirmed by a request that failed only to this node
    p.confirmed_round = s.round;
    p.confirmed_at = clock_type::now();
  }
  // A live member confirms within a pace and a request once it sees the
  // round run (every node reads at rendezvous_pace at most while a round
  // forms, whatever its poll_interval), and a member that cannot has lost
  // its lease within lease_ttl: past both, the round starts over, unless a
  // confirmation came since this read. The limit is alike on every node
  // that shares the job's read_timeout and lease.
  const auto limit = config_.lease_ttl + config_.request_timeout + 2 * rendezvous_pace;
  p.text = "round " + round + " formed with " + nodes_text(s.listed.size()) + ", and " + node_text(*unconfirmed) +
           " did not confirm it";
  if (clock_type::now() - p.confirmed_at < limit) {
    p.wrote = false;
    return std::nullopt;
  }
  const auto confirmations = prefix_ + "r/" + round + "/ok/";
  p.wrote = open_round(
      s.round, s.state_revision,
      node_text(*unconfirmed) + " did not confirm round " + round + " within " + seconds_text(limit), cause::new_round,
      {compare::unwritten_since(confirmations, prefix_end(confirmations), s.revision)});
  return std::nullopt;
}

std::string etcd_rendezvous::ended_for(const snapshot& s, const progress& p) const {
  // A node of the job (placed, or listed in the round the end came in)
  // learns why it ended; one that waited beside a running round since it
  // last joined one learns why it was not in it; one that joined a round
  // the end came before is of the job too. One that saw nothing but the
  // end came late while nodes of the job still run; once none is left, or
  // where its --nnodes is not the job's, it may well be another job under
  // an old job's id.
  if (placed_ || s.lists(node_id())) return "";
  if (!p.waited.empty()) return " (" + p.waited + ")";
  if (p.joined) return "";
  const auto nnodes = nnodes_text(config_.min_nodes, config_.max_nodes);
  const auto new_job = "a run id names one job: a new job needs a --rdzv-id of its own";
  if (s.nnodes && *s.nnodes != nnodes) {
    return " (the job ran with --nnodes " + *s.nnodes + ", this node with " + nnodes + ": " + new_job + ")";
  }
  if (!s.joined.empty() || !s.waiting.empty()) return " (it ended before this node came)";
  return std::string(" (no node of the job is left: ") + new_job + ")";
}

bool etcd_rendezvous::close_when_due(const snapshot& s, progress& p) {
  const auto n = static_cast<int>(s.joined.size());
  if (p.round != s.round || n < config_.min_nodes) p.min_joined = false;
  p.round = s.round;
  if (n >= config_.min_nodes && !p.min_joined) {
    p.min_joined = true;
    p.min_reached = clock_type::now();
  }
  p.text = std::to_string(n) + " of at least " + std::to_string(config_.min_nodes) + " nodes had joined round " +
           std::to_string(s.round);
  if (n < config_.max_nodes && !(p.min_joined && clock_type::now() - p.min_reached >= config_.last_call_timeout)) {
    return false;
  }
  json members = json::array();
  for (int i = 0; i < std::min(n, config_.max_nodes); ++i) {
    const auto& m = s.joined[static_cast<std::size_t>(i)];
    members.push_back({{"id", m.id}, {"addr", m.addr}, {"port", m.port}, {"nproc", m.nproc}});
  }
  const json running{{"round", s.round}, {"phase", "running"}, {"why", s.why}, {"cause", s.cause}, {"members", members}};
  // Holds only while the state is the one read and nobody joined since:
  // the round closes on what every node of it saw.
  const auto joins = member_prefix(s.round);
  client_.txn({compare::written_at(prefix_ + "state", s.state_revision),
               compare::unwritten_since(joins, prefix_end(joins), s.revision)},
              {put_request{prefix_ + "state", running.dump()}});
  return true;
}

assignment etcd_rendezvous::assignment_of(const std::string& self, const snapshot& s) {
  assignment a;
  a.round = static_cast<int>(s.round);
  a.nnodes = static_cast<int>(s.listed.size());
  a.master_addr = s.listed.front().addr;
  a.master_port = s.listed.front().port;
  a.world_size = 0;
  for (std::size_t i = 0; i < s.listed.size(); ++i) {
    if (s.listed[i].id == self) {
      a.node_rank = static_cast<int>(i);
      a.first_rank = a.world_size;
    }
    a.world_size += s.listed[i].nproc;
  }
  return a;
}

std::string etcd_rendezvous::member_prefix(std::int64_t round) const {
  return prefix_ + "r/" + std::to_string(round) + "/m/";
}

void etcd_rendezvous::watch(std::function<void(const round_change&)> on_change) {
  unwatch();
  if (!placed_) throw std::logic_error("rendezvous: watch before next_round placed this node");
  watcher_ = std::jthread([this, round = *placed_, on_change = std::move(on_change)](std::stop_token stop) {
    watch_round(stop, round, on_change);
  });
}

void etcd_rendezvous::unwatch() {
  watcher_.request_stop();
  if (watcher_.joinable() && watcher_.get_id() != std::this_thread::get_id()) watcher_.join();
}

void etcd_rendezvous::watch_round(std::stop_token stop, placement round,
                                  std::function<void(const round_change&)> on_change) {
  using cause = round_change::cause;
  etcd_client client(config_.endpoint, config_.request_timeout);
  // While reads fail, etcd is read again a quarter of a lease apart (sooner
  // than every poll_interval, which may be longer than the lease): an outage
  // shorter than the lease passes unseen by the round, and one that lasts
  // is told with its true length, counted from the first read that failed.
  // A round reopened for a node that waits to join closes once min_nodes
  // have joined for last_call_timeout: each member reads at least twice in
  // that time, so that a member of a long poll_interval joins it too, and
  // is not left out to reopen it in its turn, round after round.
  const auto half_last_call = std::chrono::ceil<milliseconds>(config_.last_call_timeout / 2);
  const auto interval = std::min(config_.poll_interval, std::max(rendezvous_pace, half_last_call));
  const auto retry_interval = std::clamp(config_.lease_ttl / 4, milliseconds(1), interval);
  std::optional<clock_type::time_point> failing_since;  // when the first read that failed was sent
  for (auto wait = interval; sleep_unless_stopped(stop, wait);) {
    std::optional<round_change> change;
    const auto sent = clock_type::now();
    try {
      const auto s = read(client);
      failing_since.reset();
      wait = interval;
      change = change_in(s, round);
    } catch (const etcd_error& e) {
      if (!failing_since) failing_since = sent;
      wait = retry_interval;
      if (const auto outage = clock_type::now() - *failing_since; outage >= config_.lease_ttl) {
        const auto tenths = std::chrono::floor<std::chrono::duration<std::int64_t, std::deci>>(outage);
        change = {cause::etcd_unreachable, "etcd unreachable for " + seconds_text(tenths) + ": " + e.what()};
      }
    } catch (const rendezvous_error& e) {
      change = {cause::new_round, e.what()};
    } catch (const std::exception& e) {
      // What etcd holds does not parse: nothing this node can run on.
      change = {cause::new_round, std::string("the rendezvous state cannot be read: ") + e.what()};
    }
    if (change) {
      if (!stop.stop_requested()) {
        ended_by_ = change;  // read by next_round, which joins this thread first
        on_change(*change);
      }
      return;
    }
  }
}

std::optional<round_change> etcd_rendezvous::change_in(const snapshot& s, const placement& round) const {
  using cause = round_change::cause;
  if (s.closed) return round_change{cause::closed, "the job was closed: " + *s.closed};
  // The job finished in another round (one opened as that round's ranks
  // succeeded): this one is no round of it. The round that finished runs on.
  if (s.finished && s.finished_round != round.round) return round_change{cause::closed, s.finished_text()};
  if (!s.has_state) return round_change{cause::new_round, "the job's state was removed from etcd"};
  if (s.state_revision != round.state_revision) {
    const auto what = s.cause == "lost" ? cause::member_lost : s.cause == "joining" ? cause::node_waiting : cause::new_round;
    return round_change{what, "round " + std::to_string(s.round) + " was started: " + s.why};
  }
  if (lease_lost_.load(std::memory_order_acquire) || !s.has_joined(round.self)) {
    std::string why = "this node's lease expired";
    if (const milliseconds unanswered(unanswered_ms_.load(std::memory_order_relaxed)); unanswered > milliseconds(0)) {
      const auto tenths = std::chrono::floor<std::chrono::duration<std::int64_t, std::deci>>(unanswered);
      why += ": etcd did not answer its renewals for " + seconds_text(tenths);
    }
    return round_change{cause::lease_lost, why};
  }
  // Once the job finished in this round, a member lost counts as done:
  // nothing is left to start over, and the nodes still running run on.
  for (std::size_t i = 0; i < round.members.size() && !s.finished; ++i) {
    const auto& m = round.members[i];
    if (!s.has_joined(m.id) && !s.done.contains(m.id)) {
      return round_change{cause::member_lost,
                          "node " + std::to_string(i) + " (" + m.addr + ") left without finishing: " + lease_gone};
    }
  }
  if (!s.finished && !s.waiting.empty() && round.members.size() < static_cast<std::size_t>(config_.max_nodes)) {
    return round_change{cause::node_waiting, nodes_text(s.waiting.size()) + " waiting to join"};
  }
  return std::nullopt;
}

void etcd_rendezvous::finished() {
  unwatch();
  if (!placed_) return;
  const auto& members = placed_->members;
  const auto self =
      std::find_if(members.begin(), members.end(), [&](const member& m) { return m.id == placed_->self; });
  const auto round = std::to_string(placed_->round);
  const json why{{"round", placed_->round},
                 {"why", "node " + std::to_string(self - members.begin()) + " (" + config_.local_addr +
                             ") succeeded in round " + round}};
  const put_request mark{prefix_ + "finished", why.dump()};
  // The done key only into the round that still runs: a newer one has no
  // use for it. The job is finished either way: a round opened as these
  // ranks ended (another node's restart) must not run it again.
  client_.txn({compare::written_at(prefix_ + "state", placed_->state_revision)},
              {put_request{prefix_ + "r/" + round + "/done/" + placed_->self, "done"}, mark}, {mark});
}

void etcd_rendezvous::close(const std::string& why) {
  unwatch();
  client_.put(prefix_ + "closed", why);
}

void etcd_rendezvous::restart(const std::string& why) {
  unwatch();
  if (!placed_) return;
  open_round(placed_->round, placed_->state_revision, why);
}

}  // namespace cohort_run
