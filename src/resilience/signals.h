// Stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2): the handler only records
// the signal; the training loop looks at the step boundary, the ranks agree
// (one all-reduce), checkpoint and exit 0. A second signal exits at once.
#pragma once
#include <cstdint>
#include <string>

namespace xx {

void install_stop_signals();
// After the stop checkpoint is on disk: further signals (Slurm's SIGTERM
// after `scontrol requeue`) no longer end the process early.
void ignore_stop_signals();
int pending_stop_signal();  // the first stop signal received, 0 for none
const char* signal_name(int sig);  // "SIGTERM", ...

// The stop marker: a launcher's proof that this launch stopped cleanly on a
// signal (mpirun exits 1 after forwarding a SIGTERM even when every rank
// exited 0). RUN_DIR/stopped.json, and a copy at $XUANXUE_STOP_FILE when a
// launcher (jobs/mpirun.sh, jobs/train.sbatch) set it:
//   {"stopped": true, "signal": "SIGUSR1", "step": 40, "checkpoint": "RUN_DIR/ckpt/step_00000040.h5", ...}
// Rank 0 removes both at start-up (clear_stop_marker) and writes them,
// atomically, once the stop checkpoint is on disk on every rank
// (write_stop_marker); a marker it cannot write is a warning, not a failure.
constexpr const char* kStopFileEnv = "XUANXUE_STOP_FILE";
void clear_stop_marker(const std::string& run_dir);
void write_stop_marker(const std::string& run_dir, int64_t step, int sig, int world);

}  // namespace xx
