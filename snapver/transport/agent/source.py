"""Where the node's Python finds the tracked package, and what a git checkout holding it committed.

``locate``: without a configured site-packages, the node's own Python says where it would
import the tracked package from (``importlib.util.find_spec`` of the top-level name, which
finds the package without running its ``__init__``): a wheel in site-packages, an editable
install (a ``.pth`` path or pip's ``__editable__`` finder), a source checkout on sys.path.
``op_git_head``: the checkout's HEAD as git committed it (``ls-tree`` reads objects only:
no index refresh, no lock, nothing written, no working file followed), each git bounded in
time and output.
"""

import os
import re
import sys

from .fsat import LOCATED, site_packages_of

GIT_TIMEOUT = 20.0  # seconds per git command on the node
GIT_OUTPUT_LIMIT = 16 << 20  # bytes of ls-tree output kept at most (sglang/srt: ~150 kB)
_VERSION = re.compile(r"""^\s*__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.M)


def find_dists(site, tracked_paths):
    """The ``*.dist-info`` folders whose distribution owns a tracked path's top package."""
    tops = set(path.split("/")[0] for path in tracked_paths)
    found = []  # type: list[list[str]]
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        folder = os.path.join(site, name)
        dist_name, _, version = name[: -len(".dist-info")].partition("-")
        owns = dist_name.replace("-", "_").lower() in set(t.lower() for t in tops)
        if not owns:
            try:
                with open(os.path.join(folder, "top_level.txt"), encoding="utf-8") as handle:
                    owns = bool(tops & set(line.strip() for line in handle))
            except OSError:
                pass
        if owns:
            try:
                with open(os.path.join(folder, "METADATA"), encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        if line.startswith("Name:"):
                            dist_name = line[5:].strip()
                        elif line.startswith("Version:"):
                            version = line[8:].strip()
                        elif not line.strip():
                            break
            except OSError:
                pass
            found.append([dist_name, version, name])
    return found


def _top(tracked_paths):
    return (list(tracked_paths or []) or ["sglang"])[0].strip("/").split("/")[0]


def _package_folder(spec, tracked_paths):
    """The folder of the found package that holds the tracked paths (a namespace package
    may have several); None when it is a module, not a package."""
    folders = [folder for folder in (spec.submodule_search_locations or []) if isinstance(folder, str)]
    for folder in folders:
        rest = [path.strip("/").split("/", 1) for path in tracked_paths or []]
        if any(len(parts) == 2 and os.path.isdir(os.path.join(folder, parts[1])) for parts in rest):
            return folder
    return folders[0] if folders else None


def find_root(tracked_paths):
    """``(root, problem)``: the folder holding the tracked package as the node's Python
    finds it (not imported), or None and why not."""
    top = _top(tracked_paths)
    # Not the agent's working folder (``-c`` puts it first): a ``sglang`` folder in the SSH
    # user's home is not what the deployment imports.
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]
    try:
        import importlib.util

        spec = importlib.util.find_spec(top)
    except Exception as exc:  # a broken finder or .pth hook: said, never fatal
        return None, "find_spec(%r) failed in %s: %s" % (top, sys.executable, exc)
    finally:
        sys.path[:] = saved
    if spec is None:
        return None, "%s cannot find %s (importlib.util.find_spec(%r) is None)" % (sys.executable, top, top)
    folder = _package_folder(spec, tracked_paths)
    if folder is None:
        return None, "%s finds %s as a module (%s), not a package" % (sys.executable, top, spec.origin)
    if os.path.basename(folder.rstrip("/")) != top:
        return None, "%s finds %s in %s, a folder of another name" % (sys.executable, top, folder)
    return os.path.dirname(folder.rstrip("/")) or "/", ""


def find_checkout(root):
    """The folder whose ``.git`` (a folder, or a worktree's file) is nearest above ``root``; ""."""
    folder = os.path.abspath(root)
    for _ in range(64):
        if os.path.lexists(os.path.join(folder, ".git")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return ""
        folder = parent
    return ""


def _direct_url(dist_folder):
    """``(editable, url)`` from a dist-info's direct_url.json (PEP 610)."""
    import json

    try:
        with open(os.path.join(dist_folder, "direct_url.json"), encoding="utf-8") as handle:
            data = json.load(handle)
        return bool((data.get("dir_info") or {}).get("editable")), str(data.get("url") or "")
    except (OSError, ValueError, AttributeError):
        return False, ""


def _installed_dist(root, tracked_paths):
    """``[name, version, dist-info folder]`` of the distribution owning the package: in
    ``root`` (a wheel), else in a folder on sys.path (an editable install's); None."""
    for folder in [root] + [entry for entry in sys.path if entry and entry != root]:
        if os.path.isdir(folder):
            found = find_dists(folder, tracked_paths)
            if found:
                name, version, dist_info = found[0]
                return [name, version, os.path.join(folder, dist_info)]
    return None


def _source_version(root, top):
    for name in ("version.py", "_version.py", "__init__.py"):
        try:
            with open(os.path.join(root, top, name), encoding="utf-8", errors="replace") as handle:
                match = _VERSION.search(handle.read(1 << 16))
        except OSError:
            continue
        if match:
            return match.group(1)
    return ""


def describe_install(root, tracked_paths, found_by, problem):
    """What the tracked tree at ``root`` is: a wheel, an editable install, a source tree."""
    top = _top(tracked_paths)
    dist = _installed_dist(root, tracked_paths)
    editable, url = _direct_url(dist[2]) if dist else (False, "")
    if dist and os.path.dirname(dist[2]) == root and not editable:
        how = "wheel"
    else:
        how = "editable" if editable or dist else "source"
    return {"how": how, "root": root, "package": top, "name": dist[0] if dist else top,
            "version": dist[1] if dist else _source_version(root, top), "dist_info": dist[2] if dist else "",
            "url": url, "checkout": find_checkout(root), "found_by": found_by, "problem": problem}


def locate(requested, tracked_paths):
    """The tracked tree's root and what it is; without ``requested``, found by the node's
    Python and remembered for this session's requests (``LOCATED``)."""
    if requested:
        root = site_packages_of(requested)
        return root, describe_install(root, tracked_paths, "config", "")
    found, problem = find_root(tracked_paths)
    if found is not None:
        LOCATED["root"] = found
    root = site_packages_of(None)
    return root, describe_install(root, tracked_paths, "find_spec" if found else "purelib", problem)


# -- the checkout's HEAD ---------------------------------------------------------------------


def _git_env(checkout):
    """The node's environment without its GIT_* (a GIT_DIR would point elsewhere), git told to
    take no optional lock, never prompt nor fetch a missing object, and to look no further up
    than the checkout found."""
    env = dict((key, value) for key, value in os.environ.items() if not key.startswith("GIT_"))
    env.update({"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_NO_LAZY_FETCH": "1",
                "GIT_CEILING_DIRECTORIES": os.path.dirname(checkout), "LC_ALL": "C"})
    return env


def run_git(git, args, cwd, env, timeout=GIT_TIMEOUT, limit=GIT_OUTPUT_LIMIT):
    """``(exit code, stdout, stderr tail)`` of git; code None when it ran out of time or
    wrote more than ``limit`` (it is killed: never held whole)."""
    import subprocess
    import threading

    argv = [git, "--no-pager", "--literal-pathspecs", "-c", "core.fsmonitor=false"] + args
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    out, err, over = [], [], [False]  # type: list[bytes], list[bytes], list[bool]

    def pump(stream, pieces, bounded):
        size = 0
        for piece in iter(lambda: stream.read(65536), b""):
            size += len(piece)
            if bounded and size > limit:
                over[0] = True
                _kill(process)
                return
            pieces.append(piece)
            if not bounded:
                del pieces[:-4]

    readers = [threading.Thread(target=pump, args=(process.stdout, out, True)),
               threading.Thread(target=pump, args=(process.stderr, err, False))]
    for reader in readers:
        reader.daemon = True
        reader.start()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        process.wait()
        return None, b"", "no answer within %g s" % timeout
    for reader in readers:
        reader.join(5.0)
    tail = b"".join(err)[-2000:].decode("utf-8", "replace").strip()
    if over[0]:
        return None, b"", "more than %d bytes of output" % limit
    return process.returncode, b"".join(out), tail


def _kill(process):
    try:
        os.killpg(process.pid, 9)
    except OSError:
        pass


def _find_git():
    import shutil

    return shutil.which("git")


def git_head(root, tracked_paths, timeout):
    """HEAD of the checkout holding ``root``: its commit, tag and the committed entries of the
    tracked paths (``[mode, blob id, path]``, paths as tracked), or ``problem``."""
    checkout = find_checkout(root)
    if not checkout:
        return {"problem": "%s is not in a git checkout" % root}
    git = _find_git()
    if git is None:
        return {"checkout": checkout, "problem": "no git on the node to read the checkout %s" % checkout}
    env = _git_env(checkout)
    code, out, err = run_git(git, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], root, env, timeout)
    commit = out.decode("ascii", "replace").strip()
    if code != 0 or not re.match(r"^[0-9a-f]{40,64}$", commit):
        return {"checkout": checkout, "problem": "the checkout %s has no commit at HEAD%s" % (
            checkout, ": " + err.splitlines()[-1] if err else "")}
    code, out, err = run_git(git, ["describe", "--tags", "--exact-match", "HEAD"], root, env, timeout, 4096)
    tag = out.decode("utf-8", "replace").strip() if code == 0 else ""
    # Run in the root: ls-tree names paths relative to it, as the tracked paths are.
    code, out, err = run_git(git, ["ls-tree", "-r", "-z", "HEAD", "--"] + list(tracked_paths), root, env, timeout)
    if code != 0:
        return {"checkout": checkout, "commit": commit, "problem": "git ls-tree HEAD failed in %s: %s" % (
            checkout, (err.splitlines() or ["exit %s" % code])[-1])}
    entries = []
    for record in out.split(b"\0"):
        head, tab, path = record.partition(b"\t")
        fields = head.split(b" ")
        if tab and len(fields) == 3:
            entries.append([fields[0].decode("ascii"), fields[2].decode("ascii"), os.fsdecode(path)])
    git_dir = os.path.join(checkout, ".git")
    return {"checkout": checkout, "commit": commit, "tag": tag, "entries": entries,
            "shallow": os.path.isfile(os.path.join(git_dir, "shallow"))}


def op_git_head(channel, request):
    root = site_packages_of(request.get("site_packages"))
    channel.send(git_head(root, request.get("paths") or [], float(request.get("timeout") or GIT_TIMEOUT)))
