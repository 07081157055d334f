// Files that are either wholly there or not at all: checkpoints' `latest`,
// RUN_DIR/run.json. Any layer may use these (core depends on nothing of ours).
#pragma once
#include <cstddef>
#include <string>

namespace xx {

// fsync of a file, or of a directory (so a rename in it is durable).
// Throws std::runtime_error when `path` cannot be opened.
void fsync_path(const std::string& path, bool directory);

// Writes all `size` bytes to `fd`, retrying short writes and EINTR: 0, or the errno of the failed write.
int write_all(int fd, const char* data, size_t size);

// Writes `text` to `path` through a temp file, fsync and rename.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace xx
