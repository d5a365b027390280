// How many ranks each node of a static job runs: gathered at node 0 before
// the first attempt, so that nodes of different --nproc-per-node number
// their ranks 0..N-1, as torchrun's agents do through their store. A job
// whose nodes all run as many sets TORCH_ELASTIC_WORKER_IDENTICAL=1 to
// skip it, as it skips torchrun's exchange; cohort-run then numbers the
// ranks node_rank * nproc + local_rank without asking.
//
// Over TCP at the master's address and port, which node 0 listens on until
// every node has said its count, and gives back to its rank 0 (whose store
// binds it) before any rank starts. One line each way:
//   node k -> node 0:  "cohort-run nodes 1 <nnodes> <node_rank> <nproc>\n"
//   node 0 -> node k:  "ok <nproc of node 0> ... <nproc of node nnodes-1>\n"
//                      or "error <why>\n"
// Node 0 ignores a connection that sends anything else (a stale worker's
// store client, a port scan). A node that disagrees with node 0 on the
// number of nodes, or names a node rank already taken, ends the job on
// every node that has joined, with the reason.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

struct addrinfo;

namespace cohort_run {

/// The exchange could not complete: node 0 not reached in time, nodes that
/// disagree, a port node 0 cannot listen on. The message says which.
struct node_sizes_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct node_sizes_config {
  std::string master_addr;  ///< node 0's address, as the other nodes reach it
  int master_port = 0;      ///< node 0 listens here, on every address
  int nnodes = 1;
  int node_rank = 0;
  int nproc = 1;  ///< this node's ranks
  /// The longest a node waits: node 0 for every other node, the others for
  /// node 0 to be reached and to answer.
  std::chrono::milliseconds timeout{std::chrono::seconds(600)};
  /// How long node 0 waits for a connection's line before it drops it.
  std::chrono::milliseconds greeting_timeout{std::chrono::seconds(10)};
  /// How long a node goes on trying while each try (three at least) finds
  /// its greeting taken and the connection ended without an answer, which
  /// node 0 does only when killed outright or ending, before it gives up on
  /// what listens there. A shorter `timeout` ends the wait first, with the
  /// same reason once three such tries came.
  std::chrono::milliseconds unanswered_for{std::chrono::seconds(10)};
  /// Waits at most its argument for a shutdown signal; false once one came
  /// (the exchange then ends). By default a plain sleep.
  std::function<bool(std::chrono::milliseconds)> pause;
  /// Resolves node 0's address as getaddrinfo does (the default). It runs
  /// on a thread of its own, so that a resolver that does not answer
  /// holds the node no longer than its `timeout` or a shutdown signal: it
  /// may still run after gather_node_sizes has returned, and must own what
  /// it uses.
  std::function<int(const char* host, const char* service, const addrinfo* hints, addrinfo** found)> resolve;
};

/// Each node's rank count, by node rank; nullopt when `pause` said a
/// shutdown signal came. Throws node_sizes_error.
std::optional<std::vector<int>> gather_node_sizes(const node_sizes_config& config);

/// The line a node sends, and node 0's parse of one: nullopt for anything
/// that is not a greeting. (For the tests.)
std::string greeting_of(int nnodes, int node_rank, int nproc);
struct greeting {
  int nnodes, node_rank, nproc;
};
std::optional<greeting> parse_greeting(const std::string& line);

}  // namespace cohort_run
