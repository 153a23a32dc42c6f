// A tensor-parallel worker process (rank > 0; docs/design.md, "Tensor parallelism"): what
// the pagellm-worker program runs. The leader (Engine::create with tensor_parallel_size > 1)
// spawns it as
//   pagellm-worker --connect 127.0.0.1:PORT --rank R --size N --leader-pid PID
// with the launch's token in $PAGELLM_TP_TOKEN.
#pragma once

namespace pagellm {

/// Connects to the leader, loads rank R's share of the model, builds the same ModelRunner
/// as the leader and then runs every device operation the leader sends until it says
/// shutdown or its connection ends. Dies with the leader (PR_SET_PDEATHSIG). Returns the
/// process's exit status: 0 after a shutdown, 1 after a failure (reported to the leader
/// and on stderr), 2 for bad arguments.
int run_tensor_parallel_worker(int argc, char** argv);

}  // namespace pagellm
