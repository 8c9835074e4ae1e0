"""The environment under the tree (``env``): the Python, the installed distributions,
torch's build, the GPU and driver, the kernel. Read as text, nothing imported from the
node's packages; every count, file and string bounded; no link followed out of a folder."""

import os
import re
import stat
import sys

from .fsat import DIR_FLAGS, FILE_FLAGS, site_packages_of
from .wire import AgentError, blake2b_256

MAX_DISTS = 2000  # distributions reported (the rest counted in a note)
MAX_DIRS = 64  # folders of sys.path looked through
MAX_NAMES = 100000  # names looked at in one folder
META_HEAD = 16384  # bytes of a METADATA/PKG-INFO read: its header's first lines
SMALL_FILE = 4096  # INSTALLER, direct_url.json
TORCH_VERSION_FILE = 65536
MAX_TEXT = 200  # a name, a version, an installer
MAX_URL = 500
MAX_NOTES = 20
MAX_GPUS = 64
GPU_SECONDS = 3.0
_HEADER = re.compile(r"^(Name|Version):[ \t]*(.*?)[ \t]*$")
_TORCH_FIELD = re.compile(r"^(__version__|cuda|git_version)\s*(?::\s*[^=]+)?=\s*(?:'([^'\n]*)'|\"([^\"\n]*)\"|None)",
                          re.M)
_DRIVER_IN_PROC = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d[\w.\-]*)")


def clip(text, limit=MAX_TEXT):
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def read_head(dir_fd, name, limit):
    """Up to ``limit`` bytes of a regular file in an open folder, never through a link; None
    if it is not there, is not a regular file, or cannot be read."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_headers(data):
    """Name and Version from a METADATA or PKG-INFO head (the lines before its first blank one)."""
    end = data.find(b"\n\n")
    found = {}
    for line in data[: end if end >= 0 else len(data)].decode("utf-8", "replace").split("\n"):
        if line.startswith(("Name:", "Version:")):
            match = _HEADER.match(line.rstrip("\r"))
            if match and match.group(1) not in found:
                found[match.group(1)] = match.group(2)
                if len(found) == 2:
                    break
        elif not line.strip():
            break
    return found.get("Name"), found.get("Version")


def direct_url_of(data):
    import json

    try:
        document = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    dir_info = document.get("dir_info")
    vcs = document.get("vcs_info")
    url = document.get("url")
    return {"editable": isinstance(dir_info, dict) and dir_info.get("editable") is True,
            "url": clip(url, MAX_URL) if isinstance(url, str) else "",
            "commit": clip(vcs.get("commit_id"), 80) if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str)
            else ""}


def read_dist(dir_fd, name, kind, notes):
    """One ``*.dist-info`` or ``*.egg-info`` entry of an open folder (``kind``: "dir",
    "file", "link" or "other", as its folder listed it), or None."""
    egg = name.endswith(".egg-info")
    stem = name[: -len(".egg-info" if egg else ".dist-info")]
    if kind == "link":
        notes.append("%s: a link, not followed" % clip(name))
        return None
    folder = None
    if kind == "dir":
        try:
            folder = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            notes.append("%s: unreadable" % clip(name))
            return None
    try:
        if folder is None:
            head = read_head(dir_fd, name, META_HEAD) if egg and kind == "file" else None
        else:
            head = read_head(folder, "PKG-INFO" if egg else "METADATA", META_HEAD)
        dist_name, version = parse_headers(head) if head is not None else (None, None)
        if head is None or dist_name is None or version is None:
            notes.append("%s: %s" % (clip(name), "no readable metadata" if head is None else "no Name or Version"))
        fallback_name, _, fallback_version = stem.partition("-")
        row = {"name": clip(dist_name or fallback_name), "version": clip(version or fallback_version.partition("-")[0]),
               "installer": "", "editable": False, "url": "", "commit": ""}
        if folder is not None and not egg:
            installer = read_head(folder, "INSTALLER", SMALL_FILE)
            if installer:
                row["installer"] = clip(installer.decode("utf-8", "replace").strip())
            direct = read_head(folder, "direct_url.json", SMALL_FILE)
            found = direct_url_of(direct) if direct else None
            if found:
                row.update(found)
        return row
    finally:
        if folder is not None:
            os.close(folder)


def _kind(entry):
    """A folder entry's kind from its listing (no stat where the file system says it)."""
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:
        return "other"


def scan_folder(path, seen, dists, notes):
    """Add the distributions of one folder not seen in an earlier one (sys.path order wins)."""
    try:
        dir_fd = os.open(path, DIR_FLAGS)
    except OSError:
        return
    try:
        names = []
        with os.scandir(dir_fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_NAMES:
                    notes.append("%s: more than %d names, the rest not read" % (clip(path, MAX_URL), MAX_NAMES))
                    break
                if entry.name.endswith((".dist-info", ".egg-info")):
                    names.append((entry.name, _kind(entry)))
        for name, kind in sorted(names):
            if len(dists) >= MAX_DISTS:
                seen["more"] = seen.get("more", 0) + 1
                continue
            row = read_dist(dir_fd, name, kind, notes)
            if row is None:
                continue
            key = re.sub(r"[-_.]+", "-", row["name"]).lower()
            if key not in seen:
                seen[key] = 1
                dists.append(row)
    finally:
        os.close(dir_fd)


def torch_build(folders):
    """torch's ``version.py`` read as text in the first folder that has one, or None."""
    for path in folders:
        try:
            dir_fd = os.open(os.path.join(path, "torch"), DIR_FLAGS)
        except OSError:
            continue
        try:
            data = read_head(dir_fd, "version.py", TORCH_VERSION_FILE)
        finally:
            os.close(dir_fd)
        if data is None:
            continue
        fields = {"version": "", "cuda": "", "git_version": ""}
        for match in _TORCH_FIELD.finditer(data.decode("utf-8", "replace")):
            key = "version" if match.group(1) == "__version__" else match.group(1)
            fields[key] = clip(match.group(2) or match.group(3) or "")
        return fields
    return None


def _on_path(program):
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def start_smi():
    """nvidia-smi asked for the GPUs now, in a process group of its own (so that the
    distributions are read while it answers); None if there is none or it cannot start."""
    import subprocess

    smi = _on_path("nvidia-smi")
    if smi is None:
        return None
    try:
        return subprocess.Popen([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return exc


def smi_answer(child, seconds):
    """(stdout, "") of nvidia-smi, or (None, why): killed with its process group after ``seconds``."""
    import signal
    import subprocess

    if isinstance(child, OSError):
        return None, "nvidia-smi: %s" % (child.strerror or child)
    try:
        out, _ = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        if child.stdout is not None:
            child.stdout.close()  # a grandchild that left its group may still hold the pipe
        child.wait()
        return None, "nvidia-smi did not answer within %g s (stopped)" % seconds
    if child.returncode != 0:
        return None, "nvidia-smi exited with %d" % child.returncode
    return out[:65536], ""


def gpu_facts(child, notes, seconds=GPU_SECONDS):
    """GPUs from nvidia-smi (``child``, bounded in time), else the driver from /proc; None without either."""
    if child is not None:
        out, why = smi_answer(child, seconds)
        if out is not None:
            gpus = []
            for line in out.decode("utf-8", "replace").splitlines()[:MAX_GPUS]:
                parts = [part.strip() for part in line.split(",")]
                if len(parts) >= 3 and parts[0]:
                    gpus.append({"name": clip(parts[0]), "driver": clip(parts[1]), "memory": clip(parts[2])})
            if gpus:
                return {"source": "nvidia-smi", "gpus": gpus, "driver": gpus[0]["driver"]}
            notes.append("nvidia-smi: no GPU in its answer")
        else:
            notes.append(why)
    try:
        with open("/proc/driver/nvidia/version", "rb") as handle:
            text = handle.read(SMALL_FILE).decode("utf-8", "replace")
    except OSError:
        return None
    match = _DRIVER_IN_PROC.search(text)
    return {"source": "proc", "gpus": [], "driver": clip(match.group(1)) if match else ""}


def search_folders(site):
    """site-packages first, then the Python's own site folders and sys.path (real folders, once each)."""
    folders = [site]
    try:
        import site as site_module  # with -S: its functions only, no .pth processed

        folders += list(site_module.getsitepackages())
    except (ImportError, AttributeError):
        pass
    folders += [path for path in sys.path if path and not path.endswith(".zip")]
    unique, seen = [], set()
    for path in folders:
        real = os.path.realpath(path)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            unique.append(path)
    return unique[:MAX_DIRS]


def read_environment(site, gpu_seconds=GPU_SECONDS, gpu=True):
    smi = start_smi() if gpu else None
    notes = []  # type: list[str]
    dists = []  # type: list[dict]
    seen = {}  # type: dict[str, int]
    folders = search_folders(site)
    for path in folders:
        scan_folder(path, seen, dists, notes)
    if seen.get("more"):
        notes.append("%d more distributions not read (at most %d)" % (seen["more"], MAX_DISTS))
    environment = {
        "python": {"version": "%d.%d.%d" % sys.version_info[:3], "executable": clip(sys.executable, MAX_URL),
                   "implementation": sys.implementation.name},
        "kernel": clip(os.uname().release),
        "dists": sorted(dists, key=lambda row: row["name"].lower()),
        "torch": torch_build(folders),
        "gpu": gpu_facts(smi, notes, gpu_seconds) if gpu else None,
    }
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES] + ["%d more notes" % (len(notes) - MAX_NOTES)]
    environment["notes"] = [clip(note, MAX_URL) for note in notes]
    return environment


def _small_text(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(SMALL_FILE).decode("utf-8", "replace")
    except OSError:
        return ""


def env_mark(site, gpu):
    """What the environment is read from, in stat terms: each folder's *.dist-info/*.egg-info
    (name, inode, mtime, and its METADATA/PKG-INFO's), torch/version.py, the Python, the kernel
    and its boot, the NVIDIA module loaded. Equal marks: the same environment, nothing to read
    (pip installs, upgrades and removals make new folders; a driver changes with its module)."""
    parts = ["%d.%d.%d %s %s gpu=%s" % (sys.version_info[:3] + (sys.executable, os.uname().release, bool(gpu))),
             _small_text("/proc/sys/kernel/random/boot_id"),
             _small_text("/proc/driver/nvidia/version") if gpu else ""]
    for path in search_folders(site):
        parts.append(path)
        try:
            with os.scandir(path) as entries:
                found = [entry for _, entry in zip(range(MAX_NAMES), entries)
                         if entry.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            parts.append("unreadable")
            continue
        for entry in sorted(found, key=lambda e: e.name):
            parts.append(_stat_key(entry.path, entry.name))
            for inner in ("METADATA", "PKG-INFO"):
                parts.append(_stat_key(os.path.join(entry.path, inner), inner))
        parts.append(_stat_key(os.path.join(path, "torch", "version.py"), "torch"))
    return blake2b_256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _stat_key(path, name):
    try:
        st = os.lstat(path)
    except OSError:
        return name + " -"
    return "%s %d %d %d %d" % (name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def op_env(channel, request):
    site = site_packages_of(request.get("site_packages"))
    seconds = min(GPU_SECONDS, float(request.get("gpu_seconds") or GPU_SECONDS))
    gpu = request.get("gpu", True) is not False
    try:
        mark = env_mark(site, gpu)
        if request.get("unless") == mark:  # as when the client last read it: not read again
            channel.send({"same": mark})
            return
        found = read_environment(site, seconds, gpu)
    except Exception as exc:  # noqa: BLE001 - an environment that cannot be read is the client's note
        raise AgentError("environment: %s" % clip(repr(exc), MAX_URL))
    channel.send({"env": found, "mark": mark})
