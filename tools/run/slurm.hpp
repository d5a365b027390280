// A node's place in a Slurm job step, read from the variables srun sets:
// what --node-rank, --nnodes, --rdzv-id and --master-addr would say.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cohort_run {

/// The first host of a Slurm node list, as Slurm expands it:
/// "gpu[01-03,7],cpu-a" -> gpu01 (widths kept; several bracket groups in
/// one name give every combination, the first of each group's first range
/// first); nullopt for an empty list. The list is read, not expanded: its
/// length bounds the time and memory, however many hosts it names. Throws
/// std::invalid_argument for a list Slurm would not write, wherever in it.
std::optional<std::string> nodelist_first_host(std::string_view list);

struct slurm_step {
  int node_id = 0;  ///< SLURM_NODEID
  int nnodes = 1;   ///< SLURM_STEP_NUM_NODES, else SLURM_NNODES
  std::string job_id;      ///< SLURM_JOB_ID
  std::string first_host;  ///< of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  const char* nodelist_name = "";  ///< the variable first_host was read from
};

/// The step this process runs in under srun (SLURM_STEP_ID and SLURM_NODEID
/// set), else nothing. Throws std::invalid_argument naming the variable that
/// holds something Slurm would not write.
std::optional<slurm_step> slurm_step_from_environment();

}  // namespace cohort_run
