"""ops/layer.py's pure parts: the status note of a re-created container, the push warning,
and what a node that is no container, or an exec node, records (no engine asked)."""

from __future__ import annotations

import pytest

from snapver.config import NodeSpec
from snapver.ops.layer import identity_meta, layer_warning, recreated_note, request_identity, short_id

OLD = {"engine": "docker", "name": "sglang", "id": "a" * 64, "image": "sha256:" + "1" * 64}
NEW = {"engine": "docker", "name": "sglang", "id": "b" * 64, "image": "sha256:" + "2" * 64}
PUSHED = {"action": "push", "patch": "cudagraph-bs", "state": "done", "container": OLD}
GONE = "container re-created from image sha256:222222222222 since the push of cudagraph-bs: the patch is gone"
HELD = "container re-created since the push of cudagraph-bs (the files still hold it)"


@pytest.mark.parametrize(("live", "push", "applied", "note"), [
    (NEW, PUSHED, [], GONE),
    (NEW, PUSHED, ["cudagraph-bs"], HELD),
    (NEW, PUSHED, ["another"], GONE),
    (OLD, PUSHED, [], None),  # the same container: a hand edit or a rollback, not a re-creation
    (NEW, {**PUSHED, "action": "rollback"}, [], None),  # nothing pushed to lose
    (NEW, {**PUSHED, "container": None}, [], None),  # a record from before ids were kept
    (NEW, None, [], None),  # never pushed
    ({**NEW, "id": None, "image": None}, PUSHED, [], None),  # the engine did not answer now
    (None, PUSHED, [], None),  # not asked (no container)
])
def test_recreated_note(live, push, applied, note) -> None:
    assert recreated_note(live, push, applied) == note


def test_short_ids() -> None:
    assert short_id("sha256:" + "0123456789abcdef" * 4) == "sha256:0123456789ab"
    assert short_id("0123456789abcdef" * 4) == "0123456789ab"
    assert short_id(None) == ""


def test_the_push_warning_names_the_container_nodes_only() -> None:
    box = NodeSpec("box", "/site", local=True, container="sglang")
    pod = NodeSpec("pod0", "/site", local=True, exec_prefix=("kubectl", "exec", "-i", "sglang-0", "--"))
    host = NodeSpec("ct200", "/site", host="10.1.2.200")
    warning = layer_warning("fix", [host, box, pod])
    assert warning is not None and warning.startswith("the change to box, pod0 lives in the container's writable layer")
    assert "`snapver patch export fix`" in warning
    assert layer_warning("fix", [host]) is None


def test_no_engine_is_asked_for_a_plain_node_or_an_exec_node() -> None:
    host = NodeSpec("ct200", "/site", host="10.1.2.200")
    pod = NodeSpec("pod0", "/site", local=True, exec_prefix=("kubectl", "exec", "-i", "sglang-0", "--"))
    assert identity_meta(host) is None and request_identity(host)() is None
    assert identity_meta(pod) == {"exec": "kubectl", "id": None, "image": None}
