"""How a push's units (serving groups, nodes) and its failure budget are shown: in the plan,
the question, each wave's title, and the summary of the units that failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapver.cli.fit import print_wrapped
from snapver.cli.render import console, escape

if TYPE_CHECKING:
    from snapver.config import Config
    from snapver.ops.push import PushPlan, PushResult
    from snapver.ops.run import NodeRun


def push_budget(config: Config, max_fail: str | None) -> str | None:
    """The push's failure budget: ``--max-fail``, checked before any node is asked, else the config's."""
    from snapver.failbudget import parse_max_fail

    if max_fail is None:
        return config.max_fail
    parse_max_fail(max_fail)
    return max_fail


def busy_units(plan: PushPlan) -> str:
    """The units the push writes, for the question: ``dsv3 (ct210, ct211), ct200``."""
    busy = {node.node for node in plan.nodes if node.writes}
    return ", ".join(unit.label for unit in plan.units if busy & set(unit.nodes))


def render_units(plan: PushPlan, waves: str | None, max_fail: str | None, dry_run: bool) -> None:
    """The rollout's waves by unit (a serving group is one unit, restarted in the order
    shown), and the failure budget. Waves of single nodes are shown in a dry run only: a
    real push says each wave as it starts."""
    from snapver.failbudget import allowed_failures
    from snapver.ops.units import unit_plans, wave_units

    busy = [node for node in plan.nodes if node.writes and node.error is None]
    serving = [unit for unit in plan.units if unit.serving and {n.node for n in busy} & set(unit.nodes)]
    out = console()
    if (waves is not None and dry_run) or serving:
        for index, wave in enumerate(wave_units(plan.units, busy, waves)):
            out.print(f"wave {index + 1}: {escape(', '.join(unit.label for unit in wave))}")
    for unit in serving:  # prose: wrapped at words on a terminal
        print_wrapped(out, f"serving group {escape(unit.name)}: written together, restarted in this order "
                           f"({escape(', '.join(unit.nodes))}), then health-checked; rolled back together if any fails")
    units = len(unit_plans(plan.units, busy))
    if max_fail is not None and units:
        allowed = allowed_failures(max_fail, units)
        print_wrapped(out, f"failure budget: {allowed} of {units} unit(s) may fail, each rolled back, and the push "
                           f"goes on (--max-fail {escape(max_fail)})")


def wave_title(plan: PushPlan, runs: list[NodeRun]) -> str:
    """A wave's units, by name: ``dsv3 (ct210, ct211), fleet02``."""
    names = {run.node for run in runs}
    return ", ".join(unit.label for unit in plan.units if names & set(unit.nodes))


def render_failed_units(result: PushResult) -> None:
    """Each unit that failed (rolled back), and whether the budget let the push go on."""
    failed = result.failed_units
    if not failed or (len(failed) == 1 and not failed[0].serving and result.max_fail == 0):
        return  # one node failed, no budget: its own line said it all
    if not result.max_fail:
        how = ""
    elif len(failed) <= result.max_fail:
        how = f", within the failure budget ({result.max_fail}): the push went on"
    else:
        how = f", more than the failure budget ({result.max_fail}) allows: the push stopped"
    console(stderr=True).print(f"[red]failed[/red] ({len(failed)} unit(s){how}): "
                               f"{escape(', '.join(unit.label for unit in failed))}")
