"""`snapver push` and `snapver rollback`: plan, show, ask, apply (one path for both)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from snapver import interrupt
from snapver.cli.app import app
from snapver.cli.options import AllNodesOpt, DryRunOpt, JsonOpt, YesOpt, node_args
from snapver.cli.render import console, emit_json, escape, fields_line, show_path
from snapver.cli.state import STATE

if TYPE_CHECKING:
    from rich.console import Console

    from snapver.cli.render import PlainConsole
    from snapver.ops.plan import NodePlan
    from snapver.ops.push import PushPlan, PushResult, WavesResult
    from snapver.ops.rollback import RollbackPlan, RollbacksResult
    from snapver.ops.run import NodeRun, Pauses

MAX_FAIL_HELP = ("Units (a node, or a serving group) that may fail, each rolled back and named, while the push "
                 "goes on: N, or P% of the units rounded down (default: the config's max_fail, else 0: the first "
                 "failure stops the push and rolls back what it wrote). The failure beyond it stops the push.")
_MARKS = {"write": ("M", "yellow"), "delete": ("D", "red"), "skip": ("=", "cyan"), "conflict": ("!", "red")}


def _print_step(out: Console | PlainConsole, step: object) -> None:
    """``  M PATH  (NOTE)``; the note on the next line when the terminal is too narrow for both."""
    from snapver.cli.fit import print_beside
    from snapver.ops.plan import Step

    assert isinstance(step, Step)
    mark, colour = _MARKS[step.action]
    if step.action == "write" and step.live is None:
        mark, colour = "A", "green"
    print_beside(out, f"  [{colour}]{mark}[/{colour}] {show_path(step.path)}", f"({escape(step.note)})", indent=6)


def render_node_plan(plan: NodePlan, verbose_skips: bool = True) -> None:
    out = console()
    name = escape(plan.node)
    for note in plan.notes:
        console(stderr=True).print(f"[yellow]warning[/yellow]: {name}: {escape(note)}")
    if plan.error is not None:
        console(stderr=True).print(f"[red]{name}: cannot plan[/red]: {escape(str(plan.error))}")
        return
    writes, skips, conflicts = len(plan.writes), len(plan.steps) - len(plan.writes) - len(plan.conflicts), \
        len(plan.conflicts)
    if conflicts:
        out.print(f"{name}: [red]{conflicts} conflict(s)[/red], {writes} to write, {skips} already patched")
    elif writes:
        out.print(f"{name}: {writes} to write" + (f", {skips} already patched" if skips else ""))
    else:
        out.print(f"{name}: up to date ({skips} already patched)" if skips else f"{name}: nothing to change")
    for step in plan.steps:
        if step.action != "skip" or verbose_skips:
            _print_step(out, step)


def render_run(run: NodeRun) -> None:
    name = escape(run.node)
    snapshots = f"snapshots {str(run.before)[:10]} → {str(run.after)[:10] if run.after else '?'}"
    bytecode = f", {len(run.bytecode_removed)} stale bytecode file(s) removed" if run.bytecode_removed else ""
    if run.state == "done":
        console().print(f"{name}: [green]done[/green] — wrote {len(run.written)}, deleted {len(run.deleted)}"
                        f"{bytecode}, verified; {snapshots}")
        if run.hooks_log:
            checked = [step for step in run.hooks_log if step != "restarted"]
            console().print(f"{name}: {escape(', '.join(run.hooks_log))}"
                            + (": [green]healthy[/green]" if checked else " (no health check)"))
        return
    err = console(stderr=True)
    label = {"rolled-back": "rolled back", "cancelled": "not written"}.get(run.state, run.state)
    why = " (interrupted)" if interrupt.requested() else " (another node failed)"
    err.print(f"{name}: [red]{label}[/red]" + (f": {escape(str(run.error))}" if run.error else why))
    if run.rollback_error is not None:
        err.print(f"{name}: [red]rollback failed[/red]: {escape(str(run.rollback_error))}; "
                  f"run `snapver rollback {name}`")
    if run.recovery_error is not None:
        err.print(f"{name}: [red]restart on the restored code failed[/red]: {escape(str(run.recovery_error))}")
    elif run.recovery_log:
        checked = [step for step in run.recovery_log if step != "restarted"]
        err.print(f"{name}: on the restored code: {escape(', '.join(run.recovery_log))}"
                  + (": [green]healthy[/green]" if checked else " (no health check)"))


def render_stale(stale: list, action: str) -> None:
    """One line per process that still runs the code from before this push (or rollback)."""
    from snapver.cli.ps import started_text

    out, err = console(), console(stderr=True)
    for node in stale:
        if node.error is not None:
            err.print(f"[yellow]warning[/yellow]: {escape(node.node)}: could not list its processes: "
                      f"{escape(str(node.error))}")
            continue
        for process in node.processes:
            command = process.command if len(process.command) <= 160 else process.command[:159] + "…"
            out.print(fields_line(out, [f"{escape(node.node)}: pid {process.pid}", escape(command),
                                        f"started {started_text(process)}",
                                        f"[yellow]runs code older than this {action}: restart it[/yellow]"], " "))
        for note in node.listed.warnings() if node.listed is not None else ():
            err.print(f"[yellow]warning[/yellow]: {escape(note)}")


def _render_wave(index: int, runs: list, title: str | None = None) -> None:
    console().print(f"wave {index + 1}: {escape(title or ', '.join(run.node for run in runs))}")
    for run in runs:
        render_run(run)


def _between_waves(index: int, names: list[str], pause: float, yes: bool) -> bool:
    """Before wave ``index`` (0-based): wait ``pause`` seconds; on a terminal without
    --yes, ask. False stops the push (earlier waves stay patched)."""
    if pause:
        console().print(f"waiting {pause:g} s before wave {index + 1}")
        interrupt.pause(pause)
        if interrupt.requested():
            return False
    if not yes and sys.stdin.isatty():
        try:
            return typer.confirm(f"start wave {index + 1} ({', '.join(names)})?", default=False, err=True)
        except typer.Abort:  # Ctrl-C (or end of input) at the question: the push stops like a "no"
            if sys.stderr.isatty():
                console(stderr=True).print()
            return False
    return True


def _render_waves_end(outcome: object, action: str = "push") -> None:
    """Where a rollout in waves got to (a push's ``WavesResult`` or a rollback's ``WavesOutcome``)."""
    from snapver.ops.push import WavesResult
    from snapver.ops.waves import INTERRUPTED, WavesOutcome

    assert isinstance(outcome, (WavesResult, WavesOutcome))
    total, finished = len(outcome.waves), outcome.finished
    if finished >= total:
        console().print(f"all {total} wave(s) finished")
        return
    runs = outcome.nodes if isinstance(outcome, WavesResult) else outcome.runs
    left = [run.node for run in runs if run.state == "cancelled" and not run.written]
    console(stderr=True).print(f"[red]{action} stopped[/red] after {finished} of {total} wave(s) finished; "
                               f"not written: {escape(', '.join(left)) or '-'}")
    if not isinstance(outcome, WavesResult):
        return
    for run in outcome.rolled_back:
        if run.record is None and run.state == "done":
            console(stderr=True).print(f"{escape(run.node)}: already as before the push; nothing to roll back")
            continue
        cause = "the interrupt" if outcome.why == INTERRUPTED else "the failure"
        console(stderr=True).print(f"{escape(run.node)}: rolled back as well (its wave finished before {cause}):")
        render_run(run)
    render_patched(outcome)


def render_patched(result: PushResult) -> None:
    """After a push that failed or stopped: the nodes it leaves patched, by name."""
    if result.patched:
        names = ", ".join(result.patched)
        console(stderr=True).print(f"[yellow]still patched[/yellow]: {escape(names)} "
                                   f"(`snapver rollback {escape(names.replace(', ', ' '))}` undoes it)")


def _test_pauses() -> Pauses:
    """Where a test holds this process's writes, from its environment (``snapver/testhooks.py``,
    the one reader of those variables); no pause outside the tests."""
    from snapver import testhooks
    from snapver.ops.run import Pauses

    return Pauses(testhooks.pause_after_files(), testhooks.pause_after_write())


def confirm(yes: bool, question: str) -> bool:
    """Ask on a terminal; without one, only ``--yes`` allows writing."""
    from snapver.errors import UsageError

    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError("refusing to write without a terminal to confirm on", hint="pass --yes")
    return typer.confirm(question, default=False, err=True)  # stdout may be a --json document


# The health request's options (ops/answer.py): declared here to keep push's signature short.
HealthRequestOpt = Annotated[str | None, typer.Option(
    "--health-request", metavar="URL", help="Send a request to URL from each node before writing it and again "
    "after the restart and health checks: a different answer fails the check (default: the config's "
    "health_request).")]
HealthBodyOpt = Annotated[str | None, typer.Option(
    "--health-body", metavar="JSON", help="The health request's body (JSON; sent with POST).")]
HealthMatchOpt = Annotated[str | None, typer.Option(
    "--health-match", metavar="PATH", help="Compare only this dotted JSON path of the answer (text, "
    "choices.0.text); default: the whole body.")]
HealthRequestTimeoutOpt = Annotated[float | None, typer.Option(
    "--health-request-timeout", metavar="S", help="Seconds each health request may take (default 60).")]


@app.command()
def push(
    patch: str = typer.Argument(..., help="The patch to apply."),
    targets: Annotated[list[str] | None, node_args("Where (default: the patch's --nodes).")] = None,
    all_nodes: AllNodesOpt = False,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    force: bool = typer.Option(False, "--force", help="Overwrite files that are neither the base nor the patch."),
    allow_broken: bool = typer.Option(False, "--allow-broken", help="Push files with conflict markers or that "
                                      "do not compile under the node's Python (recorded)."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Do not roll back the other nodes (nor the "
                                    "finished waves) when one fails: the units of its wave go on (--max-fail still "
                                    "decides whether the next wave starts)."),
    max_fail: str | None = typer.Option(None, "--max-fail", metavar="N|P%", help=MAX_FAIL_HELP),
    health: str | None = typer.Option(None, "--health", metavar="CMD",
                                         help="Run CMD (sh) on each node after writing; failure rolls it back."),
    health_timeout: float | None = typer.Option(None, "--health-timeout", min=1, metavar="S",
                                                   help="Seconds the restart and each health check may take "
                                                   "(default: the config's health_timeout, else 300)."),
    restart: str | None = typer.Option(None, "--restart", metavar="CMD",
                                          help="Run CMD (sh) on each node after writing, before the health "
                                          "checks (default: the config's restart)."),
    no_restart: bool = typer.Option(False, "--no-restart", help="Do not run the config's restart command."),
    health_url: str | None = typer.Option(None, "--health-url", metavar="URL",
                                             help="Poll URL from each node after writing until it answers 2xx; "
                                             "failure rolls the node back and restarts it on the restored code."),
    waves: str | None = typer.Option(None, "--waves", metavar="SPEC",
                                        help="Roll out in waves, e.g. 1,25%,100% (cumulative node counts or "
                                        "percentages; default: the config's waves): each wave written, restarted "
                                        "and healthy before the next; a failure stops the push."),
    pause: float = typer.Option(0.0, "--pause", min=0, metavar="SECONDS",
                                help="Wait this long between waves (on a terminal without --yes: ask)."),
    health_request: HealthRequestOpt = None,
    health_body: HealthBodyOpt = None,
    health_match: HealthMatchOpt = None,
    health_request_timeout: HealthRequestTimeoutOpt = None,
    rollback_all: bool = typer.Option(False, "--rollback-all",
                                      help="When a wave fails, also roll back the waves that finished: now the "
                                      "default (kept for old scripts); with --keep-going it still does."),
    json_out: JsonOpt = False,
) -> int:
    """Apply a patch to live nodes: every file equals the base or the patch, or nothing is written.

    Examples:
      snapver push fix-attn ct200 --dry-run
      snapver push fix-attn tp8 --health "python -c 'import sglang'"
      snapver push fix-attn tp8 --waves 1,100% --restart "systemctl restart sgl"
    """
    from snapver.cli.rollout import busy_units, push_budget, render_units
    from snapver.ops.answer import ask_before, check_request_options, requests_for
    from snapver.ops.hooks import hooks_for, with_baselines
    from snapver.ops.ps import stale_after_write
    from snapver.ops.push import plan_push, push_waves

    check_request_options(health_request, health_body, health_match, health_request_timeout)
    config = STATE.config()
    budget = push_budget(config, max_fail)
    waves_spec = push_waves(config, waves, rollback_all)
    store = STATE.store(config)
    out = console()
    with plan_push(store, config, patch, targets or [], all_nodes, force, allow_broken) as plan:
        requests = requests_for([n.spec for n in plan.nodes], health_request, health_body, health_match,
                                health_request_timeout)
        if not json_out:
            _render_push_plan(plan, patch, dry_run)
            render_units(plan, waves_spec, budget, dry_run)
        if plan.nothing_to_do:
            if json_out:
                emit_json({**plan.to_json(), "dry_run": dry_run, "results": [], "exit_code": 0})
            else:
                out.print("nothing to do: every node already has the patch; nothing recorded")
            return 0
        if dry_run or plan.refusal(keep_going) is not None:
            if json_out:
                emit_json({**plan.to_json(), "dry_run": dry_run, "results": [], "exit_code": plan.exit_code})
            refusal = plan.refusal()
            if refusal is not None:
                raise refusal  # conflicts, broken files or an unreachable node
            if not json_out:
                out.print("dry run: nothing written")
            return 0
        writes = sum(len(n.writes) for n in plan.nodes)
        if not confirm(yes, f"write {writes} file(s) on {busy_units(plan)}?"):
            console(stderr=True).print("snapver: nothing written")
            return 1
        hooks = hooks_for([n.spec for n in plan.nodes], restart, no_restart, health, health_url, health_timeout)
        baselines = ask_before(plan.nodes, requests)
        hooks = with_baselines(hooks, baselines if json_out else _render_baselines(baselines))
        result = _apply(store, config, plan, waves_spec, hooks, keep_going, budget,
                        pause=pause, yes=yes, json_out=json_out, rollback_all=rollback_all)
        stale = [] if interrupt.requested() else stale_after_write(plan.nodes, result.nodes, store)
    if json_out:
        emit_json({**result.to_json(), "dry_run": False, "still_running_old": [s.to_json() for s in stale],
                   "health_requests": [b.to_json() for b in baselines]})
    else:
        _render_push_result(result, stale, in_waves=waves_spec is not None)
    interrupt.check()  # an interrupted push has undone what it wrote and said so: now leave
    return result.exit_code


def _apply(store: Any, config: Any, plan: PushPlan, waves_spec: Any, hooks: Any, keep_going: bool, budget: Any, *,
           pause: float, yes: bool, json_out: bool, rollback_all: bool) -> WavesResult | PushResult:
    """Write the planned nodes: in waves when a wave spec is set, else all at once."""
    from snapver.cli.rollout import wave_title
    from snapver.ops.push import apply_push, apply_push_waves

    if waves_spec is None:
        return apply_push(store, plan, keep_going=keep_going, hooks=hooks, pauses=_test_pauses(), max_fail=budget)
    return apply_push_waves(store, config, plan, waves_spec, hooks, keep_going,
                            between=lambda index, names: _between_waves(index, names, pause, yes),
                            on_wave=None if json_out else
                            lambda index, runs: _render_wave(index, runs, wave_title(plan, runs)),
                            roll_back_finished=True if rollback_all else None, pauses=_test_pauses(),
                            max_fail=budget)


def _render_baselines(baselines: list) -> list:
    """Once per node whose health request is not compared: why. Returns ``baselines``."""
    from snapver.model import quote_controls

    for baseline in baselines:
        if baseline.note is not None:
            console(stderr=True).print(f"[yellow]warning[/yellow]: {escape(baseline.node)}: health request: "
                                       f"{escape(quote_controls(baseline.note))}")
    return baselines


def _render_push_plan(plan: PushPlan, name: str, dry_run: bool) -> None:
    out = console()
    if plan.unsaved:  # what is pushed is the saved patch, not the folder being edited
        console(stderr=True).print(f"note: patch {escape(name)}: its folder has edits not saved "
                                   f"(snapver patch save {escape(name)})")
    names = ", ".join(n.node for n in plan.nodes)
    out.print(fields_line(out, [f"push {escape(name)}", f"({len(plan.patch.files)} file(s), base "
                                f"{plan.patch.base[:10]} of {escape(plan.patch.base_node)})", f"to {escape(names)}",
                                *(["— dry run"] if dry_run else [])], separator=" "))
    for node in plan.nodes:
        render_node_plan(node)
    for broken in plan.broken:
        label = "[yellow]broken, pushed anyway[/yellow]" if plan.allow_broken else "[red]broken[/red]"
        out.print(f"{label}: {escape(str(broken))}")
    if plan.layer_warning:
        console(stderr=True).print(f"[yellow]warning[/yellow]: {escape(plan.layer_warning)}")


def _render_push_result(result: PushResult, stale: list, in_waves: bool) -> None:
    from snapver.cli.rollout import render_failed_units

    if in_waves:
        _render_waves_end(result)
    else:
        for run in result.nodes:
            render_run(run)
        if result.exit_code:
            render_patched(result)
    render_failed_units(result)
    render_stale(stale, "push")


@app.command()
def rollback(
    targets: Annotated[list[str], node_args("The nodes to restore.", required=True)],
    to: str | None = typer.Option(None, "--to", help="The snapshot to restore (default: as it was before "
                                     "the last push that changed it)."),
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    force: bool = typer.Option(False, "--force", help="Also restore files changed since the push wrote them."),
    restart: str | None = typer.Option(None, "--restart", metavar="CMD",
                                          help="Run CMD (sh) on the node after restoring it (default: the "
                                          "config's restart)."),
    no_restart: bool = typer.Option(False, "--no-restart", help="Do not run the config's restart command."),
    health: str | None = typer.Option(None, "--health", metavar="CMD", help="Run CMD (sh) after restoring."),
    health_url: str | None = typer.Option(None, "--health-url", metavar="URL",
                                             help="Poll URL from the node after restoring until it answers 2xx."),
    health_timeout: float | None = typer.Option(None, "--health-timeout", min=1, metavar="S",
                                                   help="Seconds the restart and each health check may take."),
    waves: str | None = typer.Option(None, "--waves", metavar="SPEC",
                                        help="Restore in waves, e.g. 1,100% (as push --waves; the config's waves "
                                        "is for push only): each wave restored, restarted and healthy before the "
                                        "next; a failure stops the rollback."),
    pause: float = typer.Option(0.0, "--pause", min=0, metavar="SECONDS",
                                help="Wait this long between waves (on a terminal without --yes: ask)."),
    json_out: JsonOpt = False,
) -> int:
    """Undo the last push on nodes, or restore their trees exactly to a snapshot with --to.

    Undoing restores only the files the push wrote, each only while it still holds them.

    Examples:
      snapver rollback ct200            # undo the last push on ct200
      snapver rollback ct200 --to may22
      snapver rollback tp8 --waves 1,100% --restart "systemctl restart sglang"
    """
    from snapver.config import parse_waves
    from snapver.ops.hooks import hooks_for
    from snapver.ops.ps import stale_after_write
    from snapver.ops.rollback import apply_rollbacks, plan_rollbacks, rollbacks_refusal

    if waves is not None:
        parse_waves(waves)  # a bad spec is refused before any node is asked
    config = STATE.config()
    store = STATE.store(config)
    out = console()
    plans = plan_rollbacks(store, config, targets, to, force)
    # One node without waves keeps the one-node JSON document scripts already read.
    single = len(plans) == 1 and waves is None
    try:
        if not json_out:
            _render_rollback_plans(plans, dry_run)
        refusal = rollbacks_refusal(plans)
        if refusal is not None and not dry_run:
            if json_out:
                emit_json(_rollback_json(plans, single, dry_run=False, exit_code=refusal.exit_code))
            raise refusal
        quiet = all(plan.nothing_to_do and plan.interrupted is None for plan in plans)
        if dry_run or quiet:
            if json_out:
                emit_json(_rollback_json(plans, single, dry_run=dry_run, exit_code=0))
            elif quiet:
                for plan in plans:
                    out.print(f"nothing to do: {escape(plan.node.node)} already equals {plan.target[:10]}; "
                              "nothing recorded")
            else:
                out.print("dry run: nothing written")
            return 0
        writes = sum(len(plan.node.writes) for plan in plans)
        busy = [plan.node.node for plan in plans if plan.node.writes]
        if busy and not confirm(yes, f"restore {writes} file(s) on {', '.join(busy)}?"):
            console(stderr=True).print("snapver: nothing written")
            return 1
        hooks = hooks_for([plan.node.spec for plan in plans], restart, no_restart, health, health_url,
                          health_timeout)
        result = apply_rollbacks(store, plans, hooks, waves,
                                 between=lambda index, names: _between_waves(index, names, pause, yes),
                                 on_wave=None if json_out else _render_wave, pauses=_test_pauses())
        written = [run for run in result.runs if run.written or run.deleted]
        stale = [] if interrupt.requested() else stale_after_write([plan.node for plan in plans], written, store)
    finally:
        for plan in plans:
            plan.close()
    if json_out:
        document = _rollback_json(plans, single, dry_run=False, exit_code=result.exit_code, result=result)
        emit_json({**document, "still_running_old": [s.to_json() for s in stale]})
    else:
        _render_rollback_result(plans, result, stale)
    interrupt.check()
    return result.exit_code


def _render_rollback_plans(plans: list[RollbackPlan], dry_run: bool) -> None:
    out = console()
    for plan in plans:
        reason = [escape(word) for word in f"({plan.reason})".split(" ")]  # broken between words only
        out.print(fields_line(out, [f"rollback {escape(plan.node.node)} to {plan.target[:10]}", *reason,
                                    *(["— dry run"] if dry_run else [])], separator=" "))
        if plan.interrupted is not None:
            out.print(f"{escape(plan.node.node)}: repairs the interrupted {plan.interrupted.action} of "
                      f"{escape(str(plan.interrupted.patch or '-'))} "
                      f"({plan.interrupted.time:%Y-%m-%d %H:%M})")
        render_node_plan(plan.node)


def _render_rollback_result(plans: list[RollbackPlan], result: RollbacksResult, stale: list) -> None:
    for plan in plans:
        run = result.run_of(plan.node.node)
        if run is not None and plan.nothing_to_do:
            console().print(f"{escape(plan.node.node)}: nothing to restore; the interrupted push is marked repaired")
        elif run is not None and result.waves is None:
            render_run(run)
    if result.waves is not None:
        _render_waves_end(result.waves, "rollback")
    render_stale(stale, "rollback")


def _rollback_json(plans: list[RollbackPlan], single: bool, dry_run: bool, exit_code: int,
                   result: RollbacksResult | None = None) -> dict[str, Any]:
    """One node without waves: that node's plan and result (as before several nodes could be
    named); else ``nodes``, each a plan with its result, and the waves' outcome."""
    if single:
        run = result.run_of(plans[0].node.node) if result is not None else None
        return {**plans[0].to_json(), "dry_run": dry_run, "result": run.to_json() if run else None,
                "exit_code": exit_code}
    if result is not None:
        return {**result.to_json(), "dry_run": dry_run}
    return {"nodes": [{**plan.to_json(), "result": None} for plan in plans], "dry_run": dry_run,
            "exit_code": exit_code}
