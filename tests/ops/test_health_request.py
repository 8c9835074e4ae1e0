"""The same answer before and after (issue 32 item 5): a health request sent from the node
before a push writes it and again after the restart; a different answer fails the check.

Each node is a real venv over the real sshd (``VenvNode`` of ``test_restart.py``) whose
server is a real HTTP server started from the venv's python: it imports a module of the
tracked tree and answers ``POST /generate`` with JSON built by that module's
``generate``; the restart (``serve.sh``) kills it by its pidfile and starts it again.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import tree_hashes

from snapver.config import load_config, parse_config
from snapver.errors import ConfigError
from snapver.ops.patch import import_patch
from snapver.ops.pull import pull as pull_nodes
from snapver.store.repo import Store

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
from test_restart import SYNTHETIC_MODULE, VenvNode, free_port, records, wait_health  # noqa: E402

MODULE = '''\
import random

SCALE = 1


def generate(prompt, temperature=0.0):
    words = [word[::-1] for word in prompt.split()] * SCALE
    if temperature > 0:
        words.append(str(random.random()))
    return " ".join(words)
'''
# A threading server: /health answers while a /generate hangs. Each reply carries an id and a
# time besides the text, as SGLang's meta_info does: the whole body is never the same twice.
SERVER = '''\
import importlib
import itertools
import json
import os
import sys
import sysconfig
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

package = types.ModuleType("sglang")
package.__path__ = [os.path.join(sysconfig.get_paths()["purelib"], "sglang")]
sys.modules["sglang"] = package
module = importlib.import_module(sys.argv[2])
ids = itertools.count()


class Handler(BaseHTTPRequestHandler):
    def answer(self, code, body):
        self.send_response(code)
        if len(body) < 1 << 20:  # a huge answer is read until the connection closes (HTTP/1.0)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.answer(200 if self.path == "/health" else 404, b"ok")

    def do_POST(self):
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/moved":  # to the same server on another address: never followed
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.2:%s/generate" % sys.argv[1])
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if self.path != "/generate":
            return self.answer(404, b"no such endpoint")
        text = module.generate(asked["text"], asked.get("sampling_params", {}).get("temperature", 0.0))
        self.answer(200, json.dumps({"text": text, "meta_info": {"id": next(ids), "time": time.time()}}).encode())

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''
BODY = json.dumps({"text": "the capital of France is", "sampling_params": {"temperature": 0}})
PATCHES = {
    "changes": "SCALE = 2\n",  # every word twice
    "keeps": "UNUSED = 3  # changes the file, not the answer\n",
    "huge": "def generate(prompt, temperature=0.0):\n    return 'x' * (10 << 20)\n",
    "hangs": "def generate(prompt, temperature=0.0):\n    import time\n    time.sleep(3600)\n",
}


def appended(before: str, line: str) -> bytes:
    return "".join(difflib.unified_diff(before.splitlines(True), (before + line).splitlines(True),
                                        f"a/{SYNTHETIC_MODULE}", f"b/{SYNTHETIC_MODULE}")).encode()


@pytest.fixture
def served(tmp_path, write_config, ssh_node, isolated_env):
    """``make(request=None, start=True)`` → (node, port, store): one venv node ``ct200`` whose
    server answers /generate from the tree's module; its restart and health_url in the
    config (and ``request(port)``, a health_request table, when given); the patches of PATCHES."""
    made: list[VenvNode] = []

    def make(request: Callable[[int], dict] | None = None, start: bool = True, timeout: float = 20):
        node = VenvNode(tmp_path / "nodes" / "ct200")
        made.append(node)
        (node.site / SYNTHETIC_MODULE).write_text(MODULE)
        (node.root / "server.py").write_text(SERVER)
        port = free_port()
        hooks = {"restart": node.restart_command(port), "health_url": f"http://127.0.0.1:{port}/health",
                 "health_timeout": timeout, **({"health_request": request(port)} if request else {})}
        config_path = write_config({"ct200": ssh_node("ct200", node.site, **hooks)})
        config = load_config(str(config_path))
        store = Store.open_or_create(config.store_path)
        assert pull_nodes(store, config.select(["ct200"])).exit_code == 0
        for name, line in PATCHES.items():
            import_patch(store, config, name, appended(MODULE, line), f"{name}.diff", "ct200", ("ct200",))
        if start:
            node.start(port)
        return node, port, isolated_env / "snapshots"

    yield make
    for node in made:
        node.stop()


def generate(port: int) -> str:
    import urllib.request

    asked = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=BODY.encode(), method="POST")
    with urllib.request.urlopen(asked, timeout=10) as reply:
        return json.loads(reply.read())["text"]


def pushed(store: Path) -> bool:
    """Whether any push record of ct200 exists (read with git)."""
    return subprocess.run(["git", "--git-dir", str(store), "rev-parse", "--verify", "-q", "refs/heads/pushes/ct200"],
                          capture_output=True).returncode == 0


def options(port: int, *extra: str) -> list[str]:
    return ["--health-request", f"http://127.0.0.1:{port}/generate", "--health-body", BODY, *extra]


def test_a_patch_that_changes_the_answer_fails_the_check_and_is_rolled_back(served, run_snapver) -> None:
    # The request from the config (per node), as the restart and health_url.
    node, port, store = served(lambda port: {"url": f"http://127.0.0.1:{port}/generate", "body": BODY,
                                             "match": "text"})
    original = tree_hashes(node.site)
    assert generate(port) == "eht latipac fo ecnarF si"
    result = run_snapver("push", "changes", "--yes")
    assert result.code == 3, result
    assert (f'ct200: rolled back: ct200: health request http://127.0.0.1:{port}/generate: the answer changed: '
            'before "eht latipac fo ecnarF si", after "eht latipac fo ecnarF si eht latipac fo ecnarF si"'
            in result.err), result
    assert f"ct200: on the restored code: restarted, http://127.0.0.1:{port}/health answered 200, " \
           f"http://127.0.0.1:{port}/generate: same answer as before the write: healthy" in result.err, result
    assert tree_hashes(node.site) == original  # the files as before
    assert records(store, "ct200")[0]["state"] == "rolled-back"
    assert records(store, "ct200")[0]["hooks"]["ct200"]["health_request"]["match"] == "text"
    assert generate(port) == "eht latipac fo ecnarF si"  # the server runs the restored code


def test_a_patch_that_keeps_the_answer_passes(served, run_snapver) -> None:
    node, port, store = served()
    result = run_snapver("push", "keeps", "--yes", *options(port, "--health-match", "text"))
    assert result.code == 0, result
    assert f"http://127.0.0.1:{port}/generate: same answer as before the write: healthy" in result.out, result
    assert "UNUSED = 3" in (node.site / SYNTHETIC_MODULE).read_text()
    assert records(store, "ct200")[0]["state"] == "done"


def test_a_10_mb_answer_is_a_clear_failure(served, run_snapver) -> None:
    node, port, store = served()
    original = tree_hashes(node.site)
    result = run_snapver("push", "huge", "--yes", *options(port, "--health-match", "text"))
    assert result.code == 3, result
    assert f"health request http://127.0.0.1:{port}/generate failed: answer larger than 1 MiB" in result.err, result
    assert "Traceback" not in result.err
    assert tree_hashes(node.site) == original
    assert records(store, "ct200")[0]["state"] == "rolled-back"


def test_a_server_that_never_answers_fails_within_the_timeout(served, run_snapver) -> None:
    node, port, store = served()
    original = tree_hashes(node.site)
    began = time.monotonic()
    result = run_snapver("push", "hangs", "--yes",
                         *options(port, "--health-match", "text", "--health-request-timeout", "3"))
    assert result.code == 3, result
    assert f"health request http://127.0.0.1:{port}/generate failed: no answer within 3 s" in result.err, result
    assert time.monotonic() - began < 60
    assert tree_hashes(node.site) == original
    assert records(store, "ct200")[0]["state"] == "rolled-back"
    wait_health(port)


def test_a_server_not_up_before_the_push_is_said_once_and_not_compared(served, run_snapver) -> None:
    node, port, store = served(start=False)
    result = run_snapver("push", "changes", "--yes", *options(port, "--health-match", "text"))
    assert result.code == 0, result
    said = [line for line in result.err.splitlines() if "does not answer before the push" in line]
    assert said == [f"warning: ct200: health request: http://127.0.0.1:{port}/generate does not answer before "
                    "the push (Connection refused): not compared"], result
    assert "same answer" not in result.out
    assert "SCALE = 2" in (node.site / SYNTHETIC_MODULE).read_text()


def test_an_answer_that_differs_when_asked_twice_is_not_compared(served, run_snapver) -> None:
    node, port, store = served()
    sampled = json.dumps({"text": "the capital of France is", "sampling_params": {"temperature": 0.7}})
    result = run_snapver("push", "changes", "--yes", "--health-request", f"http://127.0.0.1:{port}/generate",
                         "--health-body", sampled, "--health-match", "text", "--json")
    assert result.code == 0, result
    assert "warning" not in result.err  # said in the document
    asked = json.loads(result.out)["health_requests"]
    assert [(a["node"], a["compared"], a["note"]) for a in asked] == [
        ("ct200", False, "the answer is not deterministic: not compared")], asked


def test_the_whole_body_is_compared_without_a_match(served, run_snapver) -> None:
    _, port, _ = served()
    result = run_snapver("push", "keeps", "--yes", *options(port))
    assert result.code == 0, result
    # The reply's id and time change every time: without --health-match nothing can be compared.
    assert "warning: ct200: health request: the answer is not deterministic: not compared" in result.err, result


@pytest.mark.parametrize(("extra", "said"), [
    (["--health-match", "choices.0.text"], "the reply has no choices"),
    (["--health-match", "text", "--health-request", "URL/nope"], "answered 404"),
    (["--health-match", "text", "--health-request", "URL/moved"], "answered 307 Temporary Redirect (a redirect to "
                                                                   "http://127.0.0.2:PORT/generate, not followed)"),
])
def test_a_request_wrong_whatever_the_code_refuses_the_push(served, run_snapver, extra, said) -> None:
    node, port, store = served()
    original = tree_hashes(node.site)
    extra = [item.replace("URL", f"http://127.0.0.1:{port}") for item in extra]
    said = said.replace("PORT", str(port))
    result = run_snapver("push", "changes", "--yes", *options(port), *extra)
    assert result.code == 2, result
    assert result.err.startswith("snapver: error: ct200: health request") and said in result.err, result
    assert "nothing was written" in result.err and "Traceback" not in result.err
    assert tree_hashes(node.site) == original
    assert not pushed(store)


@pytest.mark.parametrize(("args", "said"), [
    (["--health-request", "ftp://x/"], "--health-request: expected an http:// or https:// URL"),
    (["--health-request", "http://127.0.0.1:9/g", "--health-body", "{not json"], "--health-body: expected a JSON"),
    (["--health-request", "http://127.0.0.1:9/g", "--health-match", "a..b"], "--health-match: expected a dotted"),
    (["--health-body", "{}"], "none is set"),
    (["--health-request", "http://127.0.0.1:9/g", "--health-request-timeout", "0"], "--health-request-timeout"),
])
def test_bad_options_exit_2_before_any_node_is_asked(served, run_snapver, args, said) -> None:
    node, _, store = served(start=False)
    original = tree_hashes(node.site)
    result = run_snapver("push", "changes", "--yes", *args)
    assert result.code == 2, result
    assert result.err.startswith("snapver: error: ") and said in result.err, result
    assert tree_hashes(node.site) == original and not pushed(store)


@pytest.mark.parametrize(("table", "key", "said"), [
    ({"url": "http://a/", "bogus": 1}, "health_request.bogus", "unknown key"),
    ({"body": "{}"}, "health_request.url", "missing"),
    ({"url": 5}, "health_request.url", "expected a string"),
    ({"url": "http://a/", "body": "{"}, "health_request.body", "expected a JSON document"),
    ({"url": "http://a/", "method": "PUT"}, "health_request.method", "expected GET or POST"),
    ({"url": "http://a/", "method": "GET", "body": "{}"}, "health_request.method", "GET sends no body"),
    ({"url": "http://a/", "match": ".x"}, "health_request.match", "dotted path"),
    ({"url": "http://a/", "timeout": -1}, "health_request.timeout", "positive number"),
    ("http://a/", "health_request", "expected a table"),
])
@pytest.mark.parametrize("where", ["defaults", "node"])
def test_config_tables_are_checked(table, key, said, where) -> None:
    document: dict = {"nodes": {"n": {"host": "h", "site_packages": "/sp"}}}
    (document.setdefault("defaults", {}) if where == "defaults" else document["nodes"]["n"])["health_request"] = table
    with pytest.raises(ConfigError) as caught:
        parse_config(document, Path("/x/.snapver"))
    # A table's values are checked on the node that inherits them (as health_url's): its key is named.
    owner = "defaults" if where == "defaults" and key == "health_request" else "nodes.n"
    assert caught.value.exit_code == 2 and f"/x/.snapver: {owner}.{key}: " in caught.value.message
    assert said in caught.value.message


def test_a_config_table_gives_a_post_with_its_body() -> None:
    config = parse_config({"defaults": {"health_request": {"url": "http://a/generate", "body": BODY,
                                                           "match": "text", "timeout": 5}},
                           "nodes": {"n": {"host": "h", "site_packages": "/sp"}}}, Path("/x/.snapver"))
    request = config.nodes["n"].health_request
    assert request is not None and (request.method, request.body, request.match, request.timeout) == \
        ("POST", BODY, "text", 5.0)
