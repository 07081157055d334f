#include "resilience/signals.h"
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <vector>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include "core/atomic_file.h"

namespace xx {
namespace {

volatile std::sig_atomic_t first_signal = 0;

// Only async-signal-safe calls here: the flag, write(2) and _exit(2).
void on_stop_signal(int sig) {
  if (first_signal == 0) {
    first_signal = sig;
    return;
  }
  const char* name = signal_name(sig);
  const char head[] = "xuanxue: second stop signal (";
  const char tail[] = "): exiting now, without a checkpoint\n";
  [[maybe_unused]] ssize_t w = ::write(2, head, sizeof head - 1);
  w = ::write(2, name, std::strlen(name));
  w = ::write(2, tail, sizeof tail - 1);
  ::_exit(128 + sig);
}

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // MPI's and the loader's system calls carry on
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) sigaction(sig, &action, nullptr);
}

void ignore_stop_signals() {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) std::signal(sig, SIG_IGN);
}

int pending_stop_signal() { return first_signal; }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGKILL: return "SIGKILL";
    default: return "signal";
  }
}

namespace {

std::vector<std::string> marker_paths(const std::string& run_dir) {
  std::vector<std::string> out = {(std::filesystem::path(run_dir) / "stopped.json").string()};
  if (const char* env = std::getenv(kStopFileEnv); env && *env) out.emplace_back(env);
  return out;
}

}  // namespace

void clear_stop_marker(const std::string& run_dir) {
  for (const auto& path : marker_paths(run_dir)) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

void write_stop_marker(const std::string& run_dir, int64_t step, int sig, int world) {
  const auto dir = std::filesystem::path(run_dir) / "ckpt";
  std::string latest;
  if (std::ifstream in(dir / "latest"); in) std::getline(in, latest);
  nlohmann::json marker = {{"stopped", true},
                           {"signal", signal_name(sig)},
                           {"step", step},
                           {"checkpoint", latest.empty() ? std::string() : (dir / latest).string()},
                           {"run_dir", run_dir},
                           {"ranks", world},
                           {"resume", "-resume auto"}};
  for (const auto& path : marker_paths(run_dir)) try {
      write_file_atomic(path, marker.dump() + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "xuanxue: warning: the stop marker was not written (%s): a launcher may take this clean "
                   "stop for a failure\n", e.what());
    }
}

}  // namespace xx
