"""Path operands that match nothing: every one is named, and the did-you-mean ranks by the
path's folders and its file name together (on the real sglang tree)."""

from __future__ import annotations

from pathlib import Path

from snapver_inproc import run_inproc

from snapver.ops.trees import closest_paths

RUNNER = "sglang/srt/model_executor/runner"


def test_the_storys_path_offers_the_runner_files_first(sglang_site_template: Path, ssh_node,
                                                       write_config) -> None:
    # Both nodes read the shared tree (diff never writes a node).
    write_config({name: ssh_node(name, sglang_site_template) for name in ("ct200", "ct129")})
    result = run_inproc("diff", "ct200", "ct129", "--", "model_executor/cuda_graph_runner.py",
                        "speculative/dflash_workr.py", "server_args.py")
    assert result.code == 2, result
    first, hint = result.err.splitlines()[:2]
    # Every path that matched nothing is named, not only the first.
    assert "'model_executor/cuda_graph_runner.py'" in first and "'speculative/dflash_workr.py'" in first, first
    assert "server_args.py" not in first
    runner_part, worker_part = hint.split(";")[:2]
    offered = runner_part.split("did you mean ")[1].rstrip("?").replace(" or ", ", ").split(", ")
    on_disk = {str(p.relative_to(sglang_site_template))
               for p in (sglang_site_template / RUNNER).glob("*_cuda_graph_runner.py")}
    assert offered[:2] == [f"{RUNNER}/base_cuda_graph_runner.py", f"{RUNNER}/decode_cuda_graph_runner.py"], hint
    assert set(offered) <= on_disk, (offered, on_disk)
    assert "did you mean sglang/srt/speculative/dflash_worker_v2.py" in worker_part, hint  # what the wheel has
    assert "Traceback" not in result.err


def test_ranking_weighs_folders_and_name_together() -> None:
    paths = ["sglang/srt/model_executor/cpu_graph_runner.py", "sglang/srt/multimodal/vit_cuda_graph_runner.py",
             "sglang/srt/speculative/uno_cuda_graph_runner.py", f"{RUNNER}/decode_cuda_graph_runner.py",
             f"{RUNNER}/base_cuda_graph_runner.py", "sglang/srt/layers/linear.py"]
    ranked = closest_paths("model_executor/cuda_graph_runner.py", paths, ["sglang/srt"])
    assert ranked[:2] == [f"{RUNNER}/base_cuda_graph_runner.py", f"{RUNNER}/decode_cuda_graph_runner.py"]
    assert "sglang/srt/layers/linear.py" not in ranked
    # A folder mistyped is offered as the folder.
    assert closest_paths("model_executor/runners", paths, ["sglang/srt"])[0] == RUNNER
