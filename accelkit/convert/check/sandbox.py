"""The sandbox `convert --check` runs each script in: a real copy of what the script can reach by relative paths.

Both runs (the original on one process, the conversion on N ranks) start in a copy of the user's working directory
tree, with the script's copy at the same place in it (or, for a script outside the working directory, in a copy of
its own folder). Whatever a run writes, appends, truncates, deletes or renames through a relative path (or
`__file__`) lands in the copy; the copy is removed after the run. Nothing is linked back to the user's files:

- regular files are copied (a copy-on-write clone where the file system has one: FICLONE on btrfs/XFS, else a
  plain copy);
- a symbolic link that leads inside a copied folder becomes a link to the copy; one that leads out of it is copied
  as what it points to (the file, or the folder tree), so a write "into" it cannot reach the original; one that
  leads out of it to nothing is left out (writing through it would create the file out there);
- `__pycache__` folders and virtual environments (folders holding `pyvenv.cfg`) are left out, as are FIFOs,
  sockets and devices (reading one could block the check) and what the user cannot read either.

What a sandbox cannot cover: absolute paths (`/data/run1/ckpt.pt`) reach the real file system, as they would from
any copy; the check reports the files a run wrote there. The tree is measured before anything is copied; over the
size limit, the check refuses in one line naming the limit and the biggest entries (`--sandbox-limit` raises it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from accelkit.errors import AccelkitError

DEFAULT_LIMIT = 2**30  # bytes a check copies at most, per run (the two copies never coexist)
MAX_FILES = 100_000  # a tree of more files than this is not a script's working folder
SPACE_MARGIN = 64 * 2**20  # free space left in the temp folder beyond the copy (the runs write there too)
LIMIT_OPTION = "--sandbox-limit"
FICLONE = 0x40049409  # ioctl: share the data blocks, copy on write (btrfs, XFS, bcachefs)


@dataclass(frozen=True)
class _Item:
    kind: str  # "dir" | "file" | "link"
    source: Path  # what to copy ("link": unused)
    target: PurePosixPath  # path inside the sandbox
    link_to: PurePosixPath | None = None  # "link": the path inside the sandbox it points to


@dataclass
class Sandbox:
    """One materialized copy: `cwd` is the working directory of the run, `script` the script's copy."""

    root: Path
    cwd: Path
    script: Path

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class SandboxPlan:
    """What a sandbox holds, measured before anything is copied (see `plan_sandbox`)."""

    workdir: Path
    script_target: PurePosixPath  # where the script's copy goes, inside the sandbox
    items: list[_Item] = field(default_factory=list)
    size: int = 0
    files: int = 0
    left_out: list[str] = field(default_factory=list)  # what was not copied, and why

    def materialize(self, root: Path) -> Sandbox:
        """Copy everything into `root` (a new folder); the caller removes it (Sandbox.remove)."""
        free = shutil.disk_usage(root.parent).free
        if self.size + SPACE_MARGIN > free:
            raise AccelkitError(f"convert --check needs {_human(self.size)} in {root.parent} for its copy of "
                                f"{self.workdir}, and only {_human(free)} is free",
                                hint="free some space there, or point TMPDIR at a folder with room")
        root.mkdir()
        for item in self.items:
            target = root / item.target
            if item.kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
            elif item.kind == "file":
                target.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):  # vanished or unreadable since the scan: the script can't read it
                    _copy_file(item.source, target)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.relpath(root / item.link_to, target.parent), target)
        return Sandbox(root, root / "work", root / self.script_target)


def plan_sandbox(workdir: Path, script: Path, limit: int = DEFAULT_LIMIT) -> SandboxPlan:
    """Measure the sandbox for `script` run from `workdir`: the working directory tree, and the script's folder
    when it lies outside it. Refuses (AccelkitError) when it would copy more than `limit` bytes or MAX_FILES files."""
    workdir = Path(os.path.realpath(workdir))
    script = Path(os.path.realpath(script))
    planner = _Planner(limit, workdir)
    planner.add_root(workdir, PurePosixPath("work"))
    if _inside(script, workdir):
        script_target = PurePosixPath("work") / script.relative_to(workdir).as_posix()
    else:
        planner.add_root(script.parent, PurePosixPath("script"), f"{script.parent}/")
        script_target = PurePosixPath("script") / script.name
    planner.resolve_links()
    plan = SandboxPlan(workdir, script_target, planner.items, planner.size, planner.files, planner.left_out)
    # the script itself is written by the check (the original's copy, or the conversion): never a link
    plan.items = [i for i in plan.items if i.target != script_target]
    return plan


class _Planner:
    def __init__(self, limit: int, workdir: Path) -> None:
        self.limit = limit
        self.workdir = workdir
        self.items: list[_Item] = []
        self.size = 0
        self.files = 0
        self.left_out: list[str] = []
        self.roots: list[tuple[Path, PurePosixPath]] = []  # real folder -> its copy in the sandbox
        self.links: list[tuple[Path, PurePosixPath]] = []  # symbolic links met, resolved once every root is known
        self.by_entry: Counter[str] = Counter()  # bytes per top-level entry, for the refusal

    def add_root(self, folder: Path, target: PurePosixPath, label: str | None = None) -> None:
        self.roots.append((folder, target))
        self.items.append(_Item("dir", folder, target))
        self._walk(folder, target, label)

    def _walk(self, folder: Path, target: PurePosixPath, label: str | None) -> None:
        stack = [(folder, target, label)]
        while stack:
            here, there, top = stack.pop()
            try:
                entries = sorted(os.scandir(here), key=lambda e: e.name)
            except OSError as exc:
                self.left_out.append(f"{here} ({exc.strerror or exc})")
                continue
            for entry in entries:
                path, copy = Path(entry.path), there / entry.name
                entry_label = top or self._label(path)
                try:
                    if entry.is_symlink():
                        self.links.append((path, copy))
                    elif entry.is_dir(follow_symlinks=False):
                        if entry.name == "__pycache__" or (path / "pyvenv.cfg").exists():
                            continue  # bytecode caches, virtual environments: nothing a script reads by path
                        self.items.append(_Item("dir", path, copy))
                        stack.append((path, copy, entry_label))
                    elif entry.is_file(follow_symlinks=False):
                        self._add_file(path, copy, entry.stat(follow_symlinks=False).st_size, entry_label)
                    else:
                        self.left_out.append(f"{path} (not a regular file)")
                except OSError as exc:
                    self.left_out.append(f"{path} ({exc.strerror or exc})")

    def _add_file(self, path: Path, copy: PurePosixPath, size: int, label: str) -> None:
        if not os.access(path, os.R_OK):
            self.left_out.append(f"{path} (not readable)")
            return
        self.items.append(_Item("file", path, copy))
        self.size += size
        self.files += 1
        self.by_entry[label] += size
        if self.size > self.limit or self.files > MAX_FILES:
            self._refuse()

    def resolve_links(self) -> None:
        """A link into a copied folder points at the copy; any other link is replaced by a copy of its target."""
        while self.links:
            path, copy = self.links.pop(0)
            real = Path(os.path.realpath(path))
            inside = next(((root, target) for root, target in self.roots if _inside(real, root)), None)
            if inside is not None:
                root, target = inside
                self.items.append(_Item("link", path, copy, target / real.relative_to(root).as_posix()))
            elif not real.exists():  # a link to nothing outside: writing through it would create a file there
                self.left_out.append(f"{path} (a link to {real}, which does not exist, outside the copied tree)")
            elif real.is_dir():
                if any(_inside(root, real) for root, _ in self.roots):
                    self.left_out.append(f"{path} (a link to {real}, a folder holding the copied tree)")
                    continue
                # links inside it (to itself, or to the tree) become links to the copies
                self.add_root(real, copy, f"{self._label(path)} (-> {real})")
            elif real.is_file():
                self._add_file(real, copy, real.stat().st_size, self._label(path))
            else:
                self.left_out.append(f"{path} (a link to {real}, not a regular file)")

    def _label(self, path: Path) -> str:
        """The entry of the working directory a path belongs to (`data/`), or the path itself when outside it."""
        if _inside(path, self.workdir) and path != self.workdir:
            first = path.relative_to(self.workdir).parts[0]
            return first + ("/" if (self.workdir / first).is_dir() else "")
        return str(path)

    def _refuse(self) -> None:
        biggest = ", ".join(f"{name} {_human(size)}" for name, size in self.by_entry.most_common(3))
        what = (f"more than {MAX_FILES:,} files" if self.files > MAX_FILES
                else f"more than {_human(self.limit)} (the {LIMIT_OPTION} limit)")
        raise AccelkitError(
            f"convert --check runs the scripts in a copy of the working directory {self.workdir}, and it holds "
            f"{what}: {biggest}",
            hint=f"run the check from a folder holding only the script and the data it reads, or raise the limit "
                 f"with {LIMIT_OPTION} SIZE (e.g. {LIMIT_OPTION} {_suggest(self.limit)})")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or str(path).startswith(str(folder).rstrip(os.sep) + os.sep)


def _copy_file(source: Path, target: Path) -> None:
    """A copy-on-write clone where the file system can make one, else an in-kernel copy; mode and times kept."""
    import fcntl

    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS):
                raise
            _copy_data(src, dst)
    shutil.copystat(source, target)  # mode too: a read-only file stays read-only, a write fails as it would


def _copy_data(src, dst) -> None:
    try:
        while os.copy_file_range(src.fileno(), dst.fileno(), 1 << 30):
            pass
    except OSError as exc:  # an old kernel, or file systems it cannot copy between
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        src.seek(0)
        dst.seek(0)
        dst.truncate()
        shutil.copyfileobj(src, dst)


def _human(n: float) -> str:
    from accelkit.sizes import format_bytes

    return format_bytes(n)


def _suggest(limit: int) -> str:
    return f"{max(1, round(limit * 4 / 2**30))}GiB"
