"""The engine's stderr → one line naming the node and the cause (a table, no engine needed
for the wordings this machine cannot produce: a socket refused to root, kubectl, podman)."""

from __future__ import annotations

import pytest

from snapver.config import NodeSpec
from snapver.transport.container import explain_failure

DOCKER = NodeSpec("ct201", "/sgl-workspace/sglang/python", host="10.1.2.201", container="sglang")
PODMAN = NodeSpec("box", "/sp", local=True, container="sglang", engine="podman")
POD = NodeSpec("pod0", "/sp", local=True, exec_prefix=("kubectl", "exec", "-i", "sglang-0", "--"))
PY = NodeSpec("ct201", None, python="/opt/venv/bin/python3", host="h", container="sglang")

CASES = [
    (DOCKER, "permission denied while trying to connect to the Docker daemon socket at "
             "unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/containers/json\": "
             "dial unix /var/run/docker.sock: connect: permission denied",
     "ct201: permission denied on docker's socket on 10.1.2.201", "docker group"),
    (DOCKER, "Error response from daemon: No such container: sglang",
     "ct201: container sglang not found on 10.1.2.201", "docker ps -a"),
    (DOCKER, "Error response from daemon: Container 4f1e is not running",
     "ct201: container sglang is not running on 10.1.2.201", "docker start sglang"),
    (DOCKER, "Error response from daemon: Container 4f1e is paused, unpause the container before exec",
     "ct201: container sglang is not running on 10.1.2.201", "docker start sglang"),
    (DOCKER, "bash: line 1: docker: command not found", "ct201: docker not found on 10.1.2.201", "install docker"),
    (DOCKER, "sh: 1: docker: not found", "ct201: docker not found on 10.1.2.201", "install docker"),
    (DOCKER, 'OCI runtime exec failed: exec failed: unable to start container process: exec: "/bin/sh": '
             "stat /bin/sh: no such file or directory: unknown",
     "ct201: no /bin/sh in container sglang", "POSIX sh"),
    (DOCKER, "snapver: no python3 or python on the node",
     "ct201: no Python in container sglang (no python3 or python on its PATH)", "set `python`"),
    (PY, "/bin/sh: 1: exec: /opt/venv/bin/python3: not found",
     "ct201: no Python at /opt/venv/bin/python3 in container sglang", "set `python`"),
    (PODMAN, 'Error: no container with name or ID "sglang" found: no such container',
     "box: container sglang not found on this machine", "podman ps -a"),
    (PODMAN, "Error: can only create exec sessions on running containers: container state improper",
     "box: container sglang is not running on this machine", "podman start sglang"),
    (POD, 'Error from server (NotFound): pods "sglang-0" not found',
     "pod0: the pod of the container of exec kubectl ... is gone (not found)", "kubectl get pods"),
    (POD, 'error: unable to upgrade connection: container not found ("sglang")',
     "pod0: the container of exec kubectl ... not found in its pod", "-c"),
    (POD, "bash: kubectl: command not found", "pod0: kubectl not found on this machine", "install kubectl"),
]


@pytest.mark.parametrize(("spec", "stderr", "message", "hint"), CASES,
                         ids=[f"{case[0].name}-{index}" for index, case in enumerate(CASES)])
def test_engine_wording_to_cause(spec: NodeSpec, stderr: str, message: str, hint: str) -> None:
    error = explain_failure(spec, stderr + "\n")
    assert error is not None and error.exit_code == 3
    assert error.message == message
    assert error.hint and hint in error.hint, error.hint


def test_unknown_wording_is_left_to_the_generic_message() -> None:
    assert explain_failure(DOCKER, "Traceback (most recent call last):\n  ValueError: x\n") is None
    assert explain_failure(DOCKER, "") is None
