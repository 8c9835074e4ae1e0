"""Paths below site-packages, reached from an open folder one name at a time, never through a symlink."""

import errno
import os
import stat

from .wire import AgentError

# The root hello found by asking the node's Python (source.py ``locate``), for the
# session's requests that name no site-packages.
LOCATED = {}  # type: dict[str, str]


def site_packages_of(requested):
    site = requested or LOCATED.get("root")
    if not site:
        import sysconfig  # only here: every import is start-up time on the node

        site = sysconfig.get_paths()["purelib"]
    try:
        st = os.stat(site)
    except FileNotFoundError:
        raise AgentError("%s: no such site-packages directory" % site, "path")
    except PermissionError:
        raise AgentError("%s: permission denied" % site, "path")
    if not stat.S_ISDIR(st.st_mode):
        raise AgentError("%s: not a directory" % site, "path")
    if not os.access(site, os.R_OK | os.X_OK):
        raise AgentError("%s: permission denied" % site, "path")
    return site


# -- paths below site-packages, never through a symlink ----------------------------------
# Every path is reached one component at a time, each opened relative to its parent's
# descriptor with O_NOFOLLOW (as rsync 3.4 does since CVE-2024-12747): a folder swapped
# for a symlink at any moment fails that path instead of leading out of the tree.
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
S_ISDIR, S_ISREG = stat.S_ISDIR, stat.S_ISREG  # one lookup less per listed name
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC
# A FIFO put in a file's place would block an open for reading: never block, check the kind
# on the descriptor.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | O_CLOEXEC


class Unsafe(AgentError):
    """A folder on a path's way that is a symlink (or not a folder): never followed."""

    def __init__(self, path, what):
        AgentError.__init__(self, "%s: %s" % (path, what), "unsafe")
        self.path, self.what = path, what

    def through(self, rel):
        """The refusal for ``rel``, whose way passes through this folder."""
        if self.what == "is a symlink":
            return "%s: passes through the symlink %s" % (rel, self.path)
        return "%s: %s is not a folder" % (rel, self.path)


class At(object):
    """A name in an open folder (``dir_fd``); ``shown`` is its path for messages: a string,
    or a ``(tree, rel)`` pair joined only when shown (a listing makes one per file and
    shows almost none)."""

    __slots__ = ("dir_fd", "name", "_shown")

    def __init__(self, dir_fd, name, shown):
        self.dir_fd, self.name, self._shown = dir_fd, name, shown

    @property
    def shown(self):
        if not isinstance(self._shown, str):
            tree, rel = self._shown
            self._shown = tree.full(rel)
        return self._shown

    def __str__(self):
        return self.shown


def lstat_at(where):
    """lstat of a path (a str, for tests and the site itself) or of an ``At``."""
    if isinstance(where, At):
        return os.stat(where.name, dir_fd=where.dir_fd, follow_symlinks=False)
    return os.lstat(where)


def readlink_at(where):
    if isinstance(where, At):
        return os.readlink(where.name, dir_fd=where.dir_fd)
    return os.readlink(where)


def open_file_at(where):
    """A descriptor of a regular file, opened without following a link or blocking."""
    try:
        if isinstance(where, At):
            fd = os.open(where.name, FILE_FLAGS, dir_fd=where.dir_fd)
        else:
            fd = os.open(where, FILE_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link put in the file's place since its lstat
            raise NotRegular(str(where))
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(str(where))
    return fd


class NotRegular(OSError):
    """A path listed as a regular file that is something else now (never read)."""

    def __str__(self):
        return "%s: no longer a regular file" % self.args[0]


def special_text(st):
    """What a snapshot records for a FIFO, socket or device (never opened): a line git keeps."""
    mode = st.st_mode
    if stat.S_ISFIFO(mode):
        what = "fifo"
    elif stat.S_ISSOCK(mode):
        what = "socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "%s device %d,%d" % ("character" if stat.S_ISCHR(mode) else "block",
                                    os.major(st.st_rdev), os.minor(st.st_rdev))
    else:
        what = "file of type %o" % stat.S_IFMT(mode)
    return ("snapver: special file: %s\n" % what).encode("ascii")


class Tree(object):
    """site-packages, opened once (its own path may pass through links: it is configured);
    every folder below it is opened with ``open_dir``."""

    def __init__(self, site):
        self.site = site
        self.fd = os.open(site, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        self._last = None  # (reldir, fd) of the last folder asked for: paths come in runs

    def close(self):
        self._forget()
        os.close(self.fd)

    def _forget(self):
        if self._last is not None:
            os.close(self._last[1])
            self._last = None

    def full(self, rel):
        return os.path.join(self.site, rel)

    def open_dir(self, reldir, create=None):
        """A new descriptor of folder ``reldir`` (the caller closes it). A component that is
        a symlink or not a folder raises Unsafe; a missing one FileNotFoundError, unless
        ``create`` is a list: then it is made (owned like its parent when we are root) and
        its path appended to the list."""
        fd = os.dup(self.fd)
        done = []
        try:
            for part in reldir.split("/") if reldir else ():
                done.append(part)
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if create is None:
                        raise FileNotFoundError(errno.ENOENT, "no such file or directory", self.full("/".join(done)))
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if os.geteuid() == 0:
                        parent = os.fstat(fd)
                        os.chown(part, parent.st_uid, parent.st_gid, dir_fd=fd, follow_symlinks=False)
                    create.append("/".join(done))
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._why(fd, part, "/".join(done), exc)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def dir_for(self, reldir):
        """``open_dir`` kept open for the next path in the same folder (do not close it)."""
        if self._last is not None and self._last[0] == reldir:
            return self._last[1]
        self._forget()
        fd = self.open_dir(reldir)
        self._last = (reldir, fd)
        return fd

    def _why(self, fd, part, shown, exc):
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return exc
        if stat.S_ISLNK(st.st_mode):
            return Unsafe(self.full(shown), "is a symlink")
        if not stat.S_ISDIR(st.st_mode):
            return Unsafe(self.full(shown), "not a folder")
        return exc

    def same_dir(self, reldir, fd):
        """True while ``reldir`` still leads, without links, to the folder ``fd`` is open on."""
        try:
            now = self.open_dir(reldir)
        except (OSError, AgentError):
            return False
        try:
            a, b = os.fstat(now), os.fstat(fd)
            return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        finally:
            os.close(now)


def open_tracked_root(tree, tracked):
    """A descriptor of a tracked folder; it must exist, and no component may be a symlink."""
    try:
        return tree.open_dir(tracked.strip("/"))
    except FileNotFoundError as exc:
        raise AgentError("%s: no such file or directory" % (exc.filename or tree.full(tracked)), "path")
    except PermissionError:
        raise AgentError("%s: permission denied" % tree.full(tracked), "path")
    except Unsafe as exc:
        raise AgentError("%s; tracked paths may not pass through one" % exc, "path")


def at_path(tree, rel):
    """An ``At`` for ``rel`` (its folder from ``tree.dir_for``)."""
    reldir, _, name = rel.rpartition("/")
    return At(tree.dir_for(reldir), name, tree.full(rel))
