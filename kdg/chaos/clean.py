"""`kdg chaos clean`: delete what chaos cells left behind.

A passed cell deletes its own topics and rows once audited (:meth:`kdg.chaos.cell.Cell.forget`), and so does a
cell a stop signal ended. Three kinds of cell do not: a failed one and any run with ``--keep`` (kept to be
read), and the cell a ``kdg chaos run`` killed with SIGKILL was in the middle of. Their topics are named
``chaos-FAULT-TAG`` (``chaos-FAULT-TAG-N`` for a cell of several topics, each written to a table of the same
name; with ``-out`` for a Kafka sink's output and ``.dlq`` for dead letters), their groups
``chaos-GUARANTEE-TAG``; this finds them by those names, in Kafka and in Postgres, and deletes each cell the way
a passed cell deletes itself. A cell that a process still runs for, or whose group still has members, is left
alone: a chaos run is using it.
"""

import re
import shutil
from dataclasses import dataclass, field

from kdg.guarantees import Guarantee
from kdg.settings import TableName
from kdg.stack import procs
from kdg.stack.layout import StackLayout

_NAME = re.compile(r"^chaos-(?P<fault>[a-z0-9-]+?)-(?P<tag>[0-9a-f]{8})(?P<n>-[0-9]+)?(?P<out>-out)?(?:\.dlq)?$")


@dataclass
class Leftover:
    tag: str
    fault: str
    topic: str                                            # the cell's input topic (the stem of TOPIC-N)
    inputs: list[str] = field(default_factory=list)       # its input topics: the topic, or TOPIC-1 … TOPIC-N
    topics: list[str] = field(default_factory=list)       # every topic of the cell found in Kafka
    groups: list[str] = field(default_factory=list)       # the group names a cell with this tag could have had
    outputs: list[str] = field(default_factory=list)      # a Kafka sink's output topic
    in_use: str = ""                                      # why it was left alone
    deleted: bool = False


def _cell_name(name: str):
    """(fault, tag, is an output topic, the input topic it is or comes from) of a chaos cell's topic name, or None."""
    from kdg.chaos.run import ENGINES

    found = _NAME.match(name)
    if found is None or found["fault"] not in ENGINES["both"]:
        return None
    return found["fault"], found["tag"], bool(found["out"]), f"chaos-{found['fault']}-{found['tag']}{found['n'] or ''}"


def find_leftovers(layout: StackLayout, extra: dict) -> list[Leftover]:
    """Cells left behind: from their topics in Kafka, and from their producer runs in Postgres (a clean-up that
    deleted the topics and then failed leaves rows only)."""
    from kdg.kafka.admin import active_groups, topic_names
    from kdg.store.pg import Store

    cells: dict[str, Leftover] = {}

    def cell(fault: str, tag: str) -> Leftover:
        return cells.setdefault(tag, Leftover(tag, fault, f"chaos-{fault}-{tag}",
                                              groups=[f"chaos-{g.value}-{tag}" for g in Guarantee]))

    for name in topic_names(layout.bootstrap_servers, extra):
        parsed = _cell_name(name)
        if parsed is not None:
            found = cell(*parsed[:2])
            found.topics.append(name)
            if parsed[2] and not name.endswith(".dlq"):
                found.outputs.append(name)
            if parsed[3] not in found.inputs:
                found.inputs.append(parsed[3])
    store = Store(layout.pg_dsn)
    try:
        for row in store.fetch("SELECT DISTINCT topic FROM kdg_producer_runs WHERE topic LIKE 'chaos-%'"):
            parsed = _cell_name(row["topic"])
            if parsed is not None and not parsed[2]:
                found = cell(*parsed[:2])
                if parsed[3] not in found.inputs:
                    found.inputs.append(parsed[3])
    finally:
        store.close()
    busy = active_groups(layout.bootstrap_servers, extra)
    for found in cells.values():
        members = sorted(set(found.groups) & busy)
        running = sorted(procs.running_with(found.topic))
        if running:  # a cell's processes run here, on the local stack's machine; a killed run's may outlive it
            found.in_use = f"process {', '.join(map(str, running))} is running for it (a chaos run, or one it outlived)"
        elif members:
            found.in_use = (f"group {members[0]} has members: a chaos run is using it, or a killed consumer's "
                            "session has not expired yet (try again in a few seconds)")
    return sorted(cells.values(), key=lambda c: c.topic)


def clean(layout: StackLayout, extra: dict, *, dry_run: bool = False) -> list[Leftover]:
    """Delete every cell left behind that no one is using (none with ``dry_run``); the cells found."""
    from kdg.chaos.cell import checkpoint_dir, forget

    leftovers = find_leftovers(layout, extra)
    for found in leftovers:
        if dry_run or found.in_use:
            continue
        tables = [TableName(None, t).text for t in found.inputs if t != found.topic]  # a table per topic of N
        forget(layout.bootstrap_servers, layout.pg_dsn, extra, found.inputs or [found.topic], found.groups,
               found.outputs, tables)
        shutil.rmtree(checkpoint_dir(layout, found.tag), ignore_errors=True)
        found.deleted = True
    return leftovers
