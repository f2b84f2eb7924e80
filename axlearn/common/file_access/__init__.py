"""The one file layer for everything a run reads and writes inside its directories.

A run's directories (trainer dir, checkpoint dir, events, compilation cache, run records,
metrics, Hugging Face import/export dirs) may be shared with other users, who can create
entries in them. Every file a tool opens there goes through this module, under one rule:

- **The root is the directory the user named.** Links above it (in the path the user typed) are
  the user's choice and are followed. Every path *inside* it is relative (never absolute, never
  `..`) and is resolved from a directory file descriptor of the root with no symbolic link
  followed at any component: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel
  has it (Linux >= 5.6), otherwise one `openat(O_NOFOLLOW | O_DIRECTORY)` per directory
  component. There is no window between a check and the open: the check *is* the open.
- **Regular files only.** A file is opened with `O_NONBLOCK | O_NOFOLLOW` and `fstat`-ed on its
  descriptor; a FIFO, directory, socket or device is refused without blocking.
- **Reads of metadata are bounded.** `read_bytes`/`read_text`/`read_json` take `max_bytes`;
  `read_json` also bounds nesting (checked before parsing, so a 100,000-deep file is one error,
  not a `RecursionError`), and non-UTF-8 bytes are one error naming the file and the offset.
- **Writes are whole.** `write_atomic` writes a temporary file in the same directory, fsyncs it,
  renames it over the destination (a link there is replaced, its target untouched) and fsyncs
  the directory. `append_line` appends one whole line in one `write` with `O_APPEND`.
- **Errors name the file and the rule, never content.** `FileAccessError` (an `OSError`, so
  existing `except OSError` paths keep working) reads `"<path>: <rule>"`.

What holds on object stores: a bucket mounted with gcsfuse or similar has no symbolic links an
attacker can plant and no FIFOs, but it also has no atomic rename of directories, no `flock`
shared between hosts and no `O_NOFOLLOW` semantics of its own; the guarantees above are those of
a local (or NFS) POSIX filesystem. On an object store, the bucket's IAM is the boundary: only the
run's own service account may write to its prefix. Paths given as `gs://...` are not handled by
this module (TensorStore and the cloud clients open them).
"""

from axlearn.common.file_access.reads import (
    RULE_BOUNDED,
    decode_utf8,
    json_depth,
    parse_json,
    read_bytes,
    read_json,
    read_text,
)
from axlearn.common.file_access.resolve import (
    RULE_NO_LINK,
    RULE_REGULAR,
    RULE_RELATIVE,
    FileAccessError,
    FileMissingError,
    Root,
    RunDir,
    open_dir,
    open_fd,
    open_read,
    open_write,
    uses_openat2,
)
from axlearn.common.file_access.tree import (
    append_line,
    exists,
    is_dir,
    is_regular,
    listdir,
    lstat,
    makedirs,
    open_subdir,
    remove,
    rename,
    rmtree,
    split_root,
    walk,
    write_atomic,
)

__all__ = [
    "FileAccessError",
    "FileMissingError",
    "RULE_BOUNDED",
    "RULE_NO_LINK",
    "RULE_REGULAR",
    "RULE_RELATIVE",
    "Root",
    "RunDir",
    "append_line",
    "decode_utf8",
    "exists",
    "is_dir",
    "is_regular",
    "json_depth",
    "listdir",
    "lstat",
    "makedirs",
    "open_dir",
    "open_fd",
    "open_read",
    "open_subdir",
    "open_write",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_text",
    "remove",
    "rename",
    "rmtree",
    "split_root",
    "walk",
    "uses_openat2",
    "write_atomic",
]
