// pagellm-worker: one rank (> 0) of a tensor-parallel engine, started by the engine's own
// process (Engine::create with tensor_parallel_size > 1), never by hand. The library does
// the work; this only calls it.
#include "pagellm/engine/tp_worker.h"

int main(int argc, char** argv) { return pagellm::run_tensor_parallel_worker(argc, argv); }
