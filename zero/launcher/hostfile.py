"""Hostfiles and the ``--include`` / ``--exclude`` resource filters.

A hostfile lists the machines of a job, one per line, MPI style::

    # comment
    worker-0 slots=8
    worker-1 slots=8

A *resource pool* is ``{host: slot_count}`` in file order. After filtering it
becomes the *active resources*: ``{host: [slot ids]}``, still in file order,
which is what decides the ranks: node ``i`` runs the global ranks that follow
the slots of nodes ``0..i-1``.

Filter strings use DeepSpeed's syntax, ``NODE_SPEC[@NODE_SPEC ...]`` with
``NODE_SPEC = HOST[:SLOT[,SLOT ...]]``; a host without ``:SLOTS`` means all of
its slots. ``-i "w0@w1:0,2"`` keeps all of w0 and slots 0 and 2 of w1;
``-e "w1:0"`` keeps everything except slot 0 of w1.
"""

import re
from collections import OrderedDict

HOSTFILE_LINE = re.compile(r"^(?P<host>\S+)\s+slots\s*=\s*(?P<slots>\d+)$")
EXPECTED_FORM = "'<hostname> slots=<count>', e.g. 'worker-0 slots=8'"


class HostfileError(ValueError):
    """A hostfile or a filter string that cannot be used as written."""


def read_hostfile(path):
    """Parse the hostfile at ``path`` into an ordered ``{host: slots}``."""
    try:
        with open(path, "r") as f:
            lines = f.readlines()
    except OSError as e:
        raise HostfileError(f"cannot read hostfile {path}: {e.strerror}; "
                            f"pass an existing file with -H/--hostfile") from e
    return parse_hostfile_lines(lines, source=path)


def parse_hostfile_lines(lines, source="<hostfile>"):
    """Parse hostfile lines; errors name ``source:line`` and the expected form."""
    pool = OrderedDict()
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.match(line)
        if match is None:
            raise HostfileError(f"{source}:{lineno}: cannot parse {raw.strip()!r}; "
                                f"expected {EXPECTED_FORM}")
        host, slots = match.group("host"), int(match.group("slots"))
        if host in pool:
            raise HostfileError(f"{source}:{lineno}: host {host!r} is listed twice; "
                                f"give each host one line with its total slot count")
        if slots == 0:
            raise HostfileError(f"{source}:{lineno}: host {host!r} has slots=0; "
                                f"remove the line or give it at least one slot")
        pool[host] = slots
    if not pool:
        raise HostfileError(f"{source}: no hosts found; expected lines of the form {EXPECTED_FORM}")
    return pool


def parse_filter(spec, flag="--include"):
    """Parse ``host[:s,s]@host...`` into ``{host: [slots]}`` (``[]`` = whole host)."""
    nodes = OrderedDict()
    for node_spec in spec.split("@"):
        host, _, slot_text = node_spec.partition(":")
        if not host:
            raise HostfileError(f"{flag} {spec!r}: empty host name; "
                                f"expected HOST[:SLOT[,SLOT...]][@HOST...]")
        slots = nodes.setdefault(host, [])
        if slot_text:
            slots.extend(_parse_slots(slot_text, spec, flag))
    return OrderedDict((h, sorted(set(s))) for h, s in nodes.items())


def _parse_slots(slot_text, spec, flag):
    try:
        return [int(s) for s in slot_text.split(",")]
    except ValueError:
        raise HostfileError(f"{flag} {spec!r}: slots must be integers, got {slot_text!r}; "
                            f"expected HOST:0,1,2") from None


def resolve_resources(pool, include="", exclude=""):
    """Apply ``--include`` or ``--exclude`` to a pool: ``{host: [slot ids]}``."""
    if include and exclude:
        raise HostfileError("--include and --exclude are mutually exclusive; use one of them")
    active = OrderedDict((host, list(range(n))) for host, n in pool.items())
    if include:
        chosen = _apply_include(active, parse_filter(include, "--include"))
    elif exclude:
        chosen = _apply_exclude(active, parse_filter(exclude, "--exclude"))
    else:
        chosen = active
    result = OrderedDict((h, chosen[h]) for h in pool if chosen.get(h))
    if not result:
        raise HostfileError("no slots left after applying --include/--exclude; "
                            "check the filter against the hostfile")
    return result


def _check_known(active, host, slots, flag):
    if host not in active:
        raise HostfileError(f"{flag}: host {host!r} is not in the hostfile "
                            f"(known hosts: {', '.join(active)})")
    for slot in slots:
        if slot not in active[host]:
            raise HostfileError(f"{flag}: host {host!r} has no slot {slot} "
                                f"(it has slots {active[host][0]}..{active[host][-1]})")


def _apply_include(active, wanted):
    chosen = {}
    for host, slots in wanted.items():
        _check_known(active, host, slots, "--include")
        chosen[host] = slots if slots else list(active[host])
    return chosen


def _apply_exclude(active, unwanted):
    chosen = {h: list(s) for h, s in active.items()}
    for host, slots in unwanted.items():
        _check_known(active, host, slots, "--exclude")
        chosen[host] = [s for s in chosen[host] if s not in slots] if slots else []
    return chosen


def limit_resources(active, num_nodes=-1, slots_per_node=-1):
    """Keep the first ``num_nodes`` hosts and ``slots 0..slots_per_node-1`` on each."""
    hosts = list(active)
    if num_nodes > 0:
        if num_nodes > len(hosts):
            raise HostfileError(f"--num_nodes {num_nodes} asks for more hosts than the "
                                f"{len(hosts)} available ({', '.join(hosts)})")
        hosts = hosts[:num_nodes]
    if slots_per_node > 0:
        return OrderedDict((h, list(range(slots_per_node))) for h in hosts)
    return OrderedDict((h, active[h]) for h in hosts)


def rank_layout(active, node_rank):
    """Global ranks of ``node_rank``'s slots: ``[(global_rank, local_rank, slot)]``."""
    hosts = list(active)
    first = sum(len(active[h]) for h in hosts[:node_rank])
    slots = active[hosts[node_rank]]
    return [(first + local, local, slot) for local, slot in enumerate(slots)]


def world_size(active):
    return sum(len(slots) for slots in active.values())
