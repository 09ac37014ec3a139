#!/usr/bin/env python3
"""A read-only FUSE file system that mirrors a folder and injects read faults, for the tests of
the streaming engine's I/O errors (tests/faults.rs; root, libfuse2 and fusepy, which
`make setup` installs).

  python3 scripts/faultfs.py SOURCE MOUNTPOINT --file records.bin --fault eio:START-END
      a read of records.bin that overlaps bytes START..END fails with EIO
  ... --fault short
      every read of the file returns at most 512 bytes (a short read: a correct reader retries)

Runs in the foreground until unmounted (umount MOUNTPOINT).
"""
import argparse, errno, os, sys

from fuse import FUSE, FuseOSError, Operations


class FaultFS(Operations):
    def __init__(self, root, file, fault):
        self.root = os.path.realpath(root)
        self.file = file
        self.kind, _, rng = fault.partition(":")
        if self.kind == "eio":
            a, b = rng.split("-")
            self.range = (int(a), int(b))
        elif self.kind != "short":
            sys.exit(f"faultfs: unknown fault {fault!r} (eio:START-END or short)")

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def readlink(self, path):
        return os.readlink(self._path(path))

    # raw_fi: open gets the kernel's fuse_file_info, so the faulted file alone is opened with
    # direct_io (each read reaches read() below and a short answer reaches the caller as a short
    # read, not as the end of the file); the other files keep the page cache, which mmap needs
    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        fi.fh = os.open(self._path(path), os.O_RDONLY)
        if os.path.basename(path) == self.file:
            fi.direct_io = True
        return 0

    def read(self, path, size, offset, fi):
        if os.path.basename(path) == self.file:
            if self.kind == "eio" and offset < self.range[1] and offset + size > self.range[0]:
                raise FuseOSError(errno.EIO)
            if self.kind == "short":
                size = min(size, 512)
        return os.pread(fi.fh, size, offset)

    def release(self, path, fi):
        os.close(fi.fh)
        return 0

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--file", required=True, help="the file whose reads fail (by name)")
    ap.add_argument("--fault", required=True, help="eio:START-END or short")
    a = ap.parse_args()
    # direct_io for the faulted file only (see open): the loaders mmap the others
    FUSE(FaultFS(a.source, a.file, a.fault), a.mountpoint, raw_fi=True, foreground=True, ro=True, nothreads=True, allow_other=True)


if __name__ == "__main__":
    main()
