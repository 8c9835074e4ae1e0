"""Processes on the node: the commands it runs for hooks (``run``, ``health_url``) and the
ones that run the tracked tree (``ps``)."""

import os
import re
import stat
import sys
import time

from .fsat import At, Tree, site_packages_of
from .listing import walk
from .reading import hash_stable
from .source import find_root
from .wire import AgentError


def op_run(channel, request):
    """Run ``sh -c COMMAND`` on the node (a health check), with the deployment's python first
    on PATH and its site-packages first on PYTHONPATH; returns the exit code and the
    tail of the output."""
    import subprocess

    site = site_packages_of(request.get("site_packages"))
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["SNAPVER_PYTHON"] = sys.executable
    env["SNAPVER_SITE_PACKAGES"] = site
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    timeout = float(request.get("timeout") or 300)
    process = subprocess.Popen(["/bin/sh", "-c", request["command"]], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    # The output is read by a thread and the command's end is what is waited for, not the
    # pipe's: a restart that starts a server in the background (`nohup server &`) leaves
    # it holding the pipe open for as long as it runs.
    import threading

    pieces = []  # type: list[bytes]
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE

    def pump(fd=stdout.fileno()):
        try:
            for piece in iter(lambda: os.read(fd, 65536), b""):
                pieces.append(piece)
        except OSError:
            pass

    reader = threading.Thread(target=pump)
    reader.daemon = True
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(process.pid, 9)
        except OSError:
            pass
        process.wait()
    reader.join(1.0)  # what the command itself printed has arrived by now
    output = b"".join(pieces)
    channel.send({"code": process.returncode, "timed_out": timed_out,
                  "output": output[-4000:].decode("utf-8", "replace")})


# -- processes that run the tracked code (`snapver ps`) ----------------------------------
# Read from /proc only (no psutil on a node). A process is one of ours when it maps a file
# of the tracked tree (an extension module), or is a Python that can import the tree: the
# interpreter of the prefix that owns site-packages, or one with site-packages on its
# PYTHONPATH or as its working folder.
# A whole word of an option or variable name: `--tokenizer-path` is no secret, `HF_TOKEN` is.
_SECRET_WORD = re.compile(r"(^|[-_.])(tokens?|secret|password|passwd|credentials?|apikey|api[-_]key|"
                          r"access[-_]key|private[-_]key|auth)($|[-_.])", re.I)
_OWNER_LAYOUT = re.compile(r"^(/.*)/lib(?:64)?/python3(?:\.\d+)?/(?:site|dist)-packages/?$")
PS_FILES_SHOWN = 50  # changed files named per process (the rest counted)
PS_UNREADABLE_SHOWN = 50


def mask_command(argv):
    """The command line with secret-looking values masked: ``--api-key X``, ``--token=X``,
    ``HF_TOKEN=X``, ``--password X``. Masked here, so the secret never leaves the node."""
    shown, mask_next = [], False
    for token in argv:
        if mask_next:
            shown.append("***")
            mask_next = False
            continue
        name, eq, value = token.partition("=")
        if eq and value and _SECRET_WORD.search(name.lstrip("-")):
            shown.append(name + "=***")
        elif token.startswith("-") and not eq and _SECRET_WORD.search(token.lstrip("-")):
            shown.append(token)
            mask_next = True
        else:
            shown.append(token)
    return " ".join(shown)


def _proc_text(pid, name):
    with open("/proc/%d/%s" % (pid, name), "rb") as handle:
        return handle.read()


def _stat_fields(pid):
    """(comm, ppid, starttime in clock ticks) from /proc/PID/stat (readable by everyone)."""
    data = _proc_text(pid, "stat").decode("utf-8", "replace")
    comm = data[data.index("(") + 1:data.rindex(")")]
    rest = data[data.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[19])  # fields 4 and 22 of proc(5)


def _uid_of(pid):
    for line in _proc_text(pid, "status").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


def _user_name(uid, names={}):  # noqa: B006 - a cache kept across calls on purpose
    if uid not in names:
        try:
            import pwd

            names[uid] = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            names[uid] = str(uid)
    return names[uid]


def _boot_time():
    """The boot time in seconds since the epoch, from /proc/uptime (1/100 s, where
    /proc/stat btime is whole seconds): start times are compared with file ctimes."""
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return time.time() - uptime


def _hidepid():
    """The hidepid option /proc is mounted with ("" when none)."""
    try:
        with open("/proc/mounts") as handle:
            return hidepid_of(handle.read())
    except OSError:
        return ""


def hidepid_of(mounts):
    """The hidepid option of the proc mount on /proc in ``mounts`` (the text of
    /proc/mounts; "" when none). The last mount on /proc is the one in effect (a proc
    mounted over another, as in a container)."""
    found = ""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[1] == "/proc" and parts[2] == "proc":
            found = ""
            for option in parts[3].split(","):
                if option.startswith("hidepid=") and option not in ("hidepid=0", "hidepid=off"):
                    found = option
    return found


def _own_lineage():
    """This agent and its ancestors (the SSH session's shell): never listed."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = _stat_fields(pid)[1]
        except (OSError, ValueError, IndexError):
            break
    return pids


def _argv0_path(argv0, cwd, environ):
    """Where argv[0] points, without resolving symlinks (a venv's bin/python is one)."""
    if "/" in argv0:
        return os.path.normpath(os.path.join(cwd or "/", argv0))
    for folder in (environ.get(b"PATH") or b"").decode("utf-8", "replace").split(":"):
        candidate = os.path.join(folder or ".", argv0)
        if os.path.isfile(candidate):
            return os.path.normpath(os.path.join(cwd or "/", candidate))
    return argv0


def _environ(pid):
    found = {}
    for item in _proc_text(pid, "environ").split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            found[key] = value
    return found


# snapver's own processes, by their command line (world-readable, unlike the environment):
# an agent runs the bootstrap (base.py) with -c, which compiles its source as "snapver-agent";
# the compaction and the persistent connection run `python -m snapver.…`; the CLI runs
# `python -m snapver` or the `snapver` console script. Never listed by ps.
_AGENT_MARK = '"snapver-agent","exec")'
_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def is_snapvers(argv):
    """True when ``argv`` is a Python running snapver (its agent, compaction, mux or CLI)."""
    index = 1
    while index < len(argv):
        token = argv[index]
        if token in _PYTHON_OPTIONS_WITH_VALUE:
            index += 2
            continue
        if token == "-c" or (token.startswith("-c") and not token.startswith("--")):
            code = argv[index + 1] if token == "-c" and index + 1 < len(argv) else token[2:]
            return code.startswith("import sys,zlib") and _AGENT_MARK in code
        if token == "-m" or (token.startswith("-m") and not token.startswith("--")):
            module = argv[index + 1] if token == "-m" and index + 1 < len(argv) else token[2:]
            return module == "snapver" or module.startswith("snapver.")
        if not token.startswith("-") or token == "-":
            return os.path.basename(token) == "snapver"  # the console script: python .../bin/snapver
        index += 1
    return False


_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def may_run_tree(argv, site, owner, path_dirs):
    """Whether a process this user cannot read (its maps, exe) could run the tree, judged by
    what anyone may read: its command line. No when it is snapver's own, or names a program
    that is not a Python and names neither site-packages nor the deployment (``process_api``,
    ``sleep``); yes otherwise (a Python, or a command line renamed by setproctitle)."""
    if not argv or is_snapvers(argv):
        return False
    text = " ".join(argv)
    if site in text or (owner and owner in text):
        return True
    program = argv[0].split()[0] if argv[0].split() else ""
    if "/" not in program:
        found = [os.path.join(d, program) for d in path_dirs if d and os.path.isfile(os.path.join(d, program))]
        program = found[0] if found else ""
    if not program.startswith("/"):
        return True  # no program of that name here: renamed, so maybe a Python
    # A path (another mount namespace's, as pid 1's, may not be here): its name, and its target's.
    names = (os.path.basename(program), os.path.basename(os.path.realpath(program)))
    return any(name.startswith("python") for name in names)


def _unreadable_row(pid, exc, site, owner, path_dirs):
    """[pid, name, why] of a process that could not be read, or None when it cannot run the tree."""
    try:
        argv = [part.decode("utf-8", "replace") for part in _proc_text(pid, "cmdline").rstrip(b"\0").split(b"\0")]
    except (OSError, ValueError):
        argv = []
    if argv and argv != [""] and not may_run_tree(argv, site, owner, path_dirs):
        return None
    try:
        comm = _stat_fields(pid)[0]
    except (OSError, ValueError, IndexError):
        comm = "?"
    return [pid, comm, exc.strerror or str(exc)]


def _is_python(exe, maps):
    """A Python interpreter by what it runs: its binary, or a libpython it maps (an
    embedding program, a binary renamed)."""
    if os.path.basename(exe).startswith("python"):
        return True
    return any(os.path.basename(path).startswith("libpython3") for path in maps)


def _maps_of(pid):
    """{path: (inode, deleted)} of the files a process maps."""
    mapped = {}
    for line in _proc_text(pid, "maps").decode("utf-8", "surrogateescape").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path, deleted = parts[5], parts[5].endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        mapped[path] = (int(parts[4]), deleted)
    return mapped


def _open_files(pid):
    """The paths a process has open (its fds that are files)."""
    found = []  # type: list[str]
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except (PermissionError, FileNotFoundError):
        return found  # (fds of another user's process: its maps still speak)
    for name in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if target.startswith("/"):
            found.append(target[: -len(" (deleted)")] if target.endswith(" (deleted)") else target)
    return found


def _in_tree(path, site, roots):
    """``path`` relative to site-packages when it is a file of a tracked root, else None."""
    rel = path[len(site) + 1:] if path.startswith(site + "/") else None
    if rel is not None and any(rel == r or rel.startswith(r + "/") for r in roots):
        return rel
    return None


def _deployment_python(pid, exe, argv, maps, site, roots, owner, owner_exes):
    """Why a Python process runs the deployment's interpreter or imports from its
    site-packages (a list of reasons, empty when nothing says so)."""
    reasons = []
    cwd = os.readlink("/proc/%d/cwd" % pid)
    try:
        environ = _environ(pid)
    except (PermissionError, FileNotFoundError):
        environ = {}  # emptied (setproctitle) or unreadable: what it runs still speaks
    argv0 = _argv0_path(argv[0], cwd, environ)
    if owner and (exe.startswith(owner + "/bin/") or exe in owner_exes
                  or any(path.startswith(owner + "/lib/libpython") for path in maps)):
        reasons.append("the deployment's python (%s)" % exe)
    elif owner and (argv0.startswith(owner + "/bin/")
                    or environ.get(b"VIRTUAL_ENV", b"").decode("utf-8", "replace") == owner):
        reasons.append("the deployment's python (%s)" % owner)
    from_site = [path for path in maps if path.startswith(site + "/") and _in_tree(path, site, roots) is None]
    if from_site:
        reasons.append("loads modules from site-packages (maps %d of its files)" % len(from_site))
    pythonpath = environ.get(b"PYTHONPATH", b"").decode("utf-8", "replace").split(":")
    if site in [os.path.normpath(os.path.join(cwd, p)) for p in pythonpath if p]:
        reasons.append("site-packages on its PYTHONPATH")
    if cwd == site:
        reasons.append("works in site-packages")
    return reasons


def _inspect(pid, site, roots, owner, owner_exes):
    """One process: None when it does not run the tree (or is snapver's own), else its
    row (reasons, mapped files of the tree). Found by what it runs, never by its name: the
    files of the tree it maps or has open, its interpreter binary, the libraries it maps
    (a process renamed with setproctitle or ``exec -a`` keeps all of these).
    PermissionError/FileNotFoundError escape to the caller."""
    raw = _proc_text(pid, "cmdline")
    if not raw:
        return None  # a kernel thread, or a zombie
    argv = [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]
    if is_snapvers(argv):
        return None
    comm, _, ticks = _stat_fields(pid)
    maps = _maps_of(pid)
    mapped = {}
    for path, (inode, deleted) in maps.items():
        rel = _in_tree(path, site, roots)
        if rel is not None:
            mapped[rel] = (inode, deleted)
    reasons = ["maps %d file(s) of the tree" % len(mapped)] if mapped else []
    exe = ""
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except FileNotFoundError:
        pass
    if _is_python(exe, maps):
        # Open files only of a Python: another program holding a .py open does not run it.
        held = sorted(set(rel for rel in (_in_tree(path, site, roots) for path in _open_files(pid)) if rel))
        if held:
            reasons.append("has %d file(s) of the tree open" % len(held))
        reasons.extend(_deployment_python(pid, exe, argv, maps, site, roots, owner, owner_exes))
    if not reasons:
        return None
    return {"pid": pid, "comm": comm, "argv": argv, "ticks": ticks, "reasons": reasons, "mapped": mapped}


def _modules_now(site, roots, exclude, oldest_ns):
    """{rel: [ctime_ns, blob id]} of the tree's modules (.py, .so, .pyd); the blob id only
    for those changed after ``oldest_ns`` (None for the others, or one that cannot be read):
    the client judges a change by content against the tree as it was when a process started."""
    modules = {}
    tree = Tree(site)
    try:
        for rel, st, dir_fd, name in walk(tree, roots, exclude):
            if not (stat.S_ISREG(st.st_mode) and rel.endswith((".py", ".so", ".pyd"))):
                continue
            oid = None
            if st.st_ctime_ns > oldest_ns:
                try:
                    oid = hash_stable(At(dir_fd, name, tree.full(rel)), st)[0]
                except (OSError, AgentError):
                    oid = None
            modules[rel] = [st.st_ctime_ns, oid]
    except AgentError:
        pass  # a tree that cannot be walked: the mapped files still speak
    finally:
        tree.close()
    return modules


def _stale_by_ctime(row, site, modules):
    """The agent's own verdict (the client's, when no snapshot covers the process's start):
    a mapped file replaced since it started is certain; a module changed (ctime) since, may
    run old code."""
    files = []
    for rel, (inode, deleted) in sorted(row["mapped"].items()):
        try:
            now = os.lstat(os.path.join(site, rel))
            replaced = deleted or now.st_ino != inode
        except OSError:
            replaced = True
        if replaced:
            files.append({"path": rel, "certain": True, "why": "mapped, replaced since it started"})
    certain = set(item["path"] for item in files)
    for rel, (ctime_ns, _) in sorted(modules.items(), key=lambda item: item[1][0]):
        if ctime_ns > row["started_ns"] and rel not in certain:
            files.append({"path": rel, "certain": False, "why": "changed after it started: may run old code",
                          "changed_ns": ctime_ns})
    return files


def _importing_python(site, roots):
    """``(prefix, interpreter binaries)`` that import a tree kept outside any site-packages
    (an editable install, a source checkout): this agent's Python when it finds the tree
    there itself (the install's .pth or finder is on its path), as the server's Python
    does. A venv's binary is shared with other environments, so only its prefix speaks."""
    found, _ = find_root(roots)
    if found is None or os.path.realpath(found) != site:
        return "", set()
    if sys.prefix != sys.base_prefix:
        return sys.prefix, set()
    return sys.prefix, {os.path.realpath(sys.executable)}


def op_ps(channel, request):
    """The processes that run code of the tracked tree (never snapver's own), each with the
    tracked files changed (ctime) since it started: a mapped file replaced since is certain,
    a module changed since "may run old code". The tree's modules now (with the blob ids of
    those changed since the oldest process started) let the client judge by content.
    Processes that cannot be read are counted and named, never skipped."""
    site = os.path.realpath(site_packages_of(request.get("site_packages")))
    roots = [p.strip("/") for p in request["paths"]]
    match = _OWNER_LAYOUT.match(site)
    owner = match.group(1) if match else ""
    owner_exes = set()
    if not owner:
        owner, owner_exes = _importing_python(site, roots)
    if owner and not os.path.exists(os.path.join(owner, "pyvenv.cfg")):
        # Not a venv: the interpreter binary itself is the owner's (a venv's links
        # point to a base Python that other environments share).
        for name in os.listdir(os.path.join(owner, "bin")) if os.path.isdir(os.path.join(owner, "bin")) else []:
            if name.startswith("python"):
                owner_exes.add(os.path.realpath(os.path.join(owner, "bin", name)))
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    skip = _own_lineage()
    found, unreadable, scanned = [], [], 0
    path_dirs = (os.environ.get("PATH") or _DEFAULT_PATH).split(":")
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        scanned += 1
        try:
            row = _inspect(pid, site, roots, owner, owner_exes)
            if row is None:
                continue
            uid = _uid_of(pid)
        except FileNotFoundError:
            continue  # it ended while looked at
        except (PermissionError, ProcessLookupError) as exc:
            unreadable_row = _unreadable_row(pid, exc, site, owner, path_dirs)
            if unreadable_row is not None:
                unreadable.append(unreadable_row)
            continue
        row["uid"], row["user"] = uid, _user_name(uid)
        row["started_ns"] = int((boot + row.pop("ticks") / float(ticks_per_second)) * 1e9)
        found.append(row)
    modules = {}
    if found:
        modules = _modules_now(site, roots, request.get("exclude") or [], min(row["started_ns"] for row in found))
    processes = []
    for row in found:
        files = _stale_by_ctime(row, site, modules)
        mapped = {}
        for rel in sorted(row["mapped"]):
            mapped[rel] = {"replaced": any(item["path"] == rel and item["certain"] for item in files)}
        processes.append({"pid": row["pid"], "user": row["user"], "uid": row["uid"],
                          "command": mask_command(row["argv"]), "comm": row["comm"],
                          "started_ns": row["started_ns"], "reasons": row["reasons"],
                          "mapped": sorted(row["mapped"]), "mapped_detail": mapped, "restart_needed": bool(files),
                          "certain": any(item["certain"] for item in files),
                          "files": files[:PS_FILES_SHOWN], "files_more": max(0, len(files) - PS_FILES_SHOWN)})
    processes.sort(key=lambda item: item["pid"])
    unreadable.sort()
    channel.send({"processes": processes, "scanned": scanned, "unreadable": len(unreadable),
                  "unreadable_named": unreadable[:PS_UNREADABLE_SHOWN], "hidepid": _hidepid(),
                  "modules": modules, "now_ns": time.time_ns()})


class ClientGone(Exception):
    """The client closed the agent's stdin or stdout (it ended, or dropped the session)."""


def client_gone(channel):
    """True once the client closed our stdin or stdout: a long wait on its behalf stops."""
    import select

    poller = select.poll()
    try:
        for stream in (channel.rfile, channel.wfile):
            poller.register(stream.fileno(), 0)  # hang-ups and errors are reported whatever is asked
    except (AttributeError, OSError, ValueError):
        return False  # not a file (an in-process channel)
    return any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in poller.poll(0))


class TooLong(Exception):
    """A call ran out of its time (``within``)."""


def within(seconds, call):
    """``call()``, stopped with TooLong after ``seconds`` whatever it waits on: a socket
    timeout bounds each read, and a server that sends a byte now and then never meets it."""
    import signal

    def expire(signum, frame):
        raise TooLong()

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread: no alarm to be had
        return call()
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def health_opener():
    """An opener with no proxy (a health URL is the node's own server) that follows no
    redirect: a 3xx is the answer, not another server's 200."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())


def _health_attempt(opener, url, wait):
    """One GET of ``url``, the whole of it within ``wait`` seconds: ``(status, body)``, or
    ``(None, what it met)``."""
    import socket
    import urllib.error

    def get():
        with opener.open(url, timeout=wait) as reply:
            return reply.status, reply.read(200).decode("utf-8", "replace")

    try:
        return within(wait, get)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            return None, "answered %d %s (a redirect to %s, not followed)" % (
                exc.code, exc.reason, exc.headers.get("Location") or "nowhere")
        return None, "answered %d %s" % (exc.code, exc.reason)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return None, "no answer within %.1f s" % wait
        return None, getattr(reason, "strerror", None) or str(reason)
    except (socket.timeout, TimeoutError):
        return None, "no answer within %.1f s" % wait
    except TooLong:
        return None, "no answer within %.1f s (or only part of one)" % wait
    except (OSError, ValueError) as exc:
        return None, str(exc)


def op_health_url(channel, request):
    """Poll ``url`` from the node itself until it answers 2xx or ``timeout`` seconds pass,
    each attempt bounded whole. Replies whether it became healthy, and else what the last
    attempt met (refused, an HTTP status, a redirect, no answer). Stops if the client goes."""
    url = request["url"]
    began = time.monotonic()
    deadline = began + float(request.get("timeout") or 60)
    opener = health_opener()
    attempts, last = 0, "never tried"
    while True:
        attempts += 1
        wait = max(0.2, min(5.0, deadline - time.monotonic()))
        code, said = _health_attempt(opener, url, wait)
        if code is not None and 200 <= code < 300:
            channel.send({"ok": True, "status": code, "attempts": attempts, "body": said,
                          "seconds": time.monotonic() - began})
            return
        last = said if code is None else "answered %d" % code
        if time.monotonic() + 0.2 >= deadline:
            break
        if client_gone(channel):
            raise ClientGone()
        time.sleep(0.2)
    channel.send({"ok": False, "last": last, "attempts": attempts, "seconds": time.monotonic() - began})
