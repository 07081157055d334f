// Stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2): the handler only records
// the signal; the training loop looks at the step boundary, the ranks agree
// (one all-reduce), checkpoint and exit 0. A second signal exits at once.
#pragma once

namespace xx {

void install_stop_signals();
// After the stop checkpoint is on disk: further signals (Slurm's SIGTERM
// after `scontrol requeue`) no longer end the process early.
void ignore_stop_signals();
int pending_stop_signal();  // the first stop signal received, 0 for none
const char* signal_name(int sig);  // "SIGTERM", ...

}  // namespace xx
