"""Files written whole or not at all: through a temporary name, fsync, rename,
and the directory fsynced so that the rename itself survives a crash."""
import os


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path, chunks):
    """Write and fsync (in a directory that is renamed into place later)."""
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path, chunks):
    """Write through a temp file in the same directory, fsync, rename."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        write_file(tmp, chunks)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")
