// The rendezvous of an elastic multi-node job through etcd (cohort-run's
// --rdzv-backend etcd-v3): the nodes of a job agree, round after round, on
// who takes part and in which order, and learn when a round must end.
//
// Under /cohort/rdzv/<run_id>/ in etcd:
//   state            {"round": N, "phase": "joining" | "running", "why": ..., "members": [...]}
//                    the current round; "members" (running only) is its
//                    frozen list, in node-rank order
//   nnodes           the job's --nnodes (N or MIN:MAX), as the node that
//                    made the state gave it; a node that gives another is
//                    refused before it writes anything
//   closed           why the job was closed by a node that failed for good
//   finished         {"round": N, "why": ...}: a node's ranks succeeded in
//                    round N, so the job is done: no round opens after it
//   w/<node>         a node waiting for the next round (under its lease)
//   r/<N>/m/<node>   a member of round N: {"addr", "port", "nproc"} (under
//                    its lease); the creation revision orders the joins
//   r/<N>/ok/<node>  a member of round N that saw it closed and confirmed
//                    it (under its lease)
//   r/<N>/done/<node>  a member of round N whose ranks succeeded (no lease:
//                    it outlives the node)
// <node> is the node's lease id, in hex. State, nnodes, closed and finished
// outlive the job: a run id names one job.
//
// A node joins the open round with a transaction that holds only while the
// state is the one it read. Once max_nodes have joined, or min_nodes have
// for last_call_timeout, a node closes the round with a transaction that
// holds only while neither the state nor the membership changed since its
// read, writing the frozen list: exactly one view wins. Each member then
// confirms the round, and is placed in it (its ranks start) only once every
// member has: a member whose lease went before that (a node killed as it
// joined), or that did not confirm within a lease, a request and two paces
// of the rendezvous, makes the round start over before any ranks ran, so
// that no round runs with a node that is gone, and none counts it against
// its restarts. While a round forms and is confirmed, every node reads at
// that pace (rendezvous_pace), whatever its poll_interval: a deadline one
// node sets for another's confirmation holds for both. A node
// that finds the round running without it registers as waiting; members
// then open the next round (a transaction that also deletes every r/ key),
// as does the waiting node itself when no member of the running round is
// left.
//
// A round's result is the job's, as torchrun's agent closes the rendezvous
// once its workers succeed: after a node's ranks succeeded no new round
// opens, the round's other nodes run on to their own end, and a node that
// asks for a round (late, or restarting after its ranks failed) is told
// the job has finished.
#pragma once

#include "run/etcd.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cohort_run {

/// A rendezvous that cannot go on: no round formed within join_timeout,
/// etcd stayed unreachable, a node closed the job, the job has finished
/// (a node's ranks succeeded), or this node's min_nodes:max_nodes is not
/// the job's. The message says which, and names the job and the endpoint.
struct rendezvous_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What one node brings to the rendezvous.
struct rendezvous_config {
  std::string endpoint;  ///< host:port of etcd's client URL
  std::string run_id;    ///< shared by every node of the job, and by no other job
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc = 1;           ///< this node's ranks (LOCAL_WORLD_SIZE)
  std::string local_addr;  ///< the address other nodes reach this node at
  /// MASTER_PORT if this node becomes node 0; 0: a port free here as the
  /// node joins each round.
  int local_port = 0;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};     ///< the longest next_round waits
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};  ///< wait for more nodes once min_nodes joined
  /// How long a silent node stays a member (etcd rounds it up to whole
  /// seconds, and to its own minimum).
  std::chrono::milliseconds lease_ttl{std::chrono::seconds(5)};
  /// How often the watch reads the running round (or every half
  /// last_call_timeout, at least every rendezvous_pace, where that is
  /// shorter), and a node waiting beside a full running round reads it:
  /// one etcd request per poll. next_round reads otherwise every
  /// rendezvous_pace, or every poll_interval where that is shorter.
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(500)};
  /// The longest one etcd request may take (rdzv-conf read_timeout).
  std::chrono::milliseconds request_timeout{std::chrono::seconds(5)};
};

/// The longest next_round waits between two reads while a round forms or
/// waits for its members' confirmations, on every node alike: a member's
/// confirmation is due within a lease, a request and two of these.
inline constexpr std::chrono::milliseconds rendezvous_pace{100};

/// This node's place in a formed round.
struct assignment {
  int round = 0;
  int node_rank = 0;  ///< position in the order of joining
  int nnodes = 1;
  int world_size = 1;  ///< the sum of nproc over the round's nodes
  int first_rank = 0;  ///< RANK of this node's local rank 0: the sum of nproc of the nodes before it
  std::string master_addr;  ///< node 0's local_addr
  int master_port = 0;      ///< node 0's local_port
};

/// Why a watched round must end.
struct round_change {
  enum class cause {
    member_lost,       ///< a member's lease ended before it finished
    node_waiting,      ///< a node waits to join, and the round has room
    new_round,         ///< another node started a new round (its restart); one started because a
                       ///< node was lost or waits to join reports member_lost or node_waiting
    closed,            ///< a node closed the job, or the job finished in an earlier round: next_round will throw
    lease_lost,        ///< this node's own lease expired
    etcd_unreachable,  ///< etcd did not answer for lease_ttl
  };
  cause what;
  std::string reason;  ///< what happened, naming the node: "node 2 (10.0.0.3) left without finishing: ..."
};

/// One node's side of the rendezvous. Its calls may come from any thread,
/// one at a time; watch's callback runs on a thread of the watch's own.
class etcd_rendezvous {
 public:
  /// Checks the configuration (std::invalid_argument); contacts etcd only
  /// in next_round, which grants this node's lease and from then on keeps
  /// it alive on a thread of its own.
  explicit etcd_rendezvous(rendezvous_config config);
  /// Stops the watch and the keepalive, and revokes the lease: this node's
  /// keys go at once (a node that has not called finished() is then lost to
  /// the others' watch).
  ~etcd_rendezvous();
  etcd_rendezvous(const etcd_rendezvous&) = delete;
  etcd_rendezvous& operator=(const etcd_rendezvous&) = delete;

  /// Blocks until this node is placed in a formed round, every member of
  /// which confirmed it (a round whose member is lost before that starts
  /// over; once a member's ranks succeeded in it, a member lost since
  /// counts as done), and returns its place. Stops a watch still running.
  /// Retries while etcd is unreachable.
  /// Throws rendezvous_error once join_timeout has passed (saying how many
  /// nodes had joined, or what etcd last answered), when a node closed
  /// the job, when the job has finished, when the job's nodes are another
  /// min_nodes:max_nodes, or when `pause` returns false.
  /// `pause(d)` waits between reads (d, possibly 0): at most rendezvous_pace
  /// (or poll_interval, where shorter), and poll_interval while this node
  /// waits beside a full running round; by default a plain sleep.
  assignment next_round(const std::function<bool(std::chrono::milliseconds)>& pause = {});

  /// Starts watching the round next_round last returned (std::logic_error
  /// before any), with one etcd request per poll_interval: `on_change` is
  /// called once, on the watch's thread, when the round must end: a member
  /// left without finishing (its lease expired), a node waits to join
  /// (while the round has fewer than max_nodes and the job has not
  /// finished), another node started a new round, the job was closed (or
  /// finished in an earlier round), this node's own lease was lost, or etcd
  /// stayed unreachable for lease_ttl from the first read that failed (while
  /// reads fail, one every quarter of lease_ttl, or every poll_interval where
  /// that is shorter). Replaces an earlier watch.
  /// on_change should only hand the reason over: it must not call watch()
  /// nor destroy the rendezvous.
  void watch(std::function<void(const round_change&)> on_change);
  /// Stops the watch; once it returns, on_change is not called any more,
  /// unless it is running (unwatch from inside on_change returns at once).
  void unwatch();

  /// This node's ranks succeeded: its leaving does not end the round for the
  /// others, and the job is finished: no round opens after this one, and
  /// every later next_round throws. Stops this node's watch. Throws
  /// etcd_error when etcd cannot be told.
  void finished();
  /// This node failed for good: every other node's watch fires with `why`,
  /// and every next_round (this node's too) throws with it. Stops this
  /// node's watch. Throws etcd_error when etcd cannot be told.
  void close(const std::string& why);
  /// This node's ranks failed and it will try again: starts a new round for
  /// every node (their watch fires with `why` as its reason). Nothing when a newer round
  /// was already started, or when the job has finished (next_round then
  /// throws). Stops this node's watch. Throws etcd_error when etcd cannot
  /// be told.
  void restart(const std::string& why);

 private:
  struct member {
    std::string id;
    std::string addr;
    int port = 0;
    int nproc = 1;
  };
  /// The round next_round last returned, as the state it read.
  struct placement {
    std::int64_t round = 0;
    std::int64_t state_revision = 0;  ///< the state key's mod revision while the round runs
    std::string self;                 ///< this node's id in it
    std::vector<member> members;
  };
  struct snapshot;
  struct progress;

  /// One read of the job's keys.
  snapshot read(etcd_client& client) const;
  /// One step of next_round on what `s` shows, at most one write; this
  /// node's assignment once it is placed.
  std::optional<assignment> step(const snapshot& s, progress& p);
  /// One step of next_round for a member of the running round `s` shows
  /// that is not yet placed in it: confirms it, waits for the others'
  /// confirmations, or starts the round over when a member's lease went or
  /// it did not confirm in time; this node's assignment once every member
  /// confirmed, or at once where the job finished in the round.
  std::optional<assignment> confirm(const snapshot& s, progress& p);
  /// What a node that was in no round of a job learns besides the job's
  /// end: why it was in none.
  std::string ended_for(const snapshot& s, const progress& p) const;
  /// Closes the open round `s` shows when max_nodes have joined, or
  /// min_nodes have for last_call_timeout; whether it tried.
  bool close_when_due(const snapshot& s, progress& p);
  static assignment assignment_of(const std::string& self, const snapshot& s);
  std::string member_prefix(std::int64_t round) const;
  /// Grants a lease when this node has none (or lost it) and starts its keepalive.
  void ensure_lease();
  /// Renews `lease`, which lives at least until `expires` unless renewed,
  /// until `stop` or until it is lost: etcd says it is gone, or left a
  /// renewal unanswered past the time it was known to live (then sets
  /// lease_lost_).
  void keep_alive(std::stop_token stop, std::int64_t lease, std::chrono::steady_clock::time_point expires);
  /// Opens round `after` + 1 when the state is still `seen_revision`, the job has not finished and the
  /// comparisons `also` hold; false otherwise.
  bool open_round(std::int64_t after, std::int64_t seen_revision, const std::string& why,
                  round_change::cause what = round_change::cause::new_round, std::vector<compare> also = {});
  void watch_round(std::stop_token stop, placement round, std::function<void(const round_change&)> on_change);
  /// What ends `round`, as `s` shows it; nothing while it may go on.
  std::optional<round_change> change_in(const snapshot& s, const placement& round) const;
  std::string node_id() const;
  std::string where() const;

  rendezvous_config config_;
  std::string prefix_;
  etcd_client client_;  ///< the caller's; the keepalive and the watch have their own
  std::optional<placement> placed_;
  std::int64_t lease_ = 0;  ///< this node's lease; 0 before the first grant
  // Set by the keepalive when the lease is gone (and by next_round when etcd
  // says so), read by next_round and the watch. The keepalive's store is a
  // release, and the watch's load an acquire: the flag publishes
  // unanswered_ms_, written before it, to the watch's message. next_round's
  // are relaxed: it reads etcd again, and nothing else.
  std::atomic<bool> lease_lost_{false};
  /// How long etcd had left this node's renewals unanswered when the
  /// keepalive gave the lease up; 0 when it had answered. Relaxed: ordered
  /// by lease_lost_.
  std::atomic<std::int64_t> unanswered_ms_{0};
  /// What ended the round this node was placed in, as its watch saw it.
  std::optional<round_change> ended_by_;
  std::jthread keeper_;
  std::jthread watcher_;
};

}  // namespace cohort_run
