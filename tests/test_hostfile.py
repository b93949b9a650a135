"""Hostfile parsing and --include/--exclude resolution (pure, no processes)."""
import pytest

from zero.launcher.hostfile import (HostfileError, limit_resources, parse_filter,
                                    parse_hostfile_lines, rank_layout, read_hostfile,
                                    resolve_resources, world_size)

POOL_TEXT = """\
# the cluster
worker-0 slots=4

worker-1   slots=4   # spare box
worker-2 slots=2
"""


@pytest.fixture
def pool():
    return parse_hostfile_lines(POOL_TEXT.splitlines(True))


def test_parse_keeps_order_and_skips_comments_and_blanks(pool):
    assert list(pool.items()) == [("worker-0", 4), ("worker-1", 4), ("worker-2", 2)]


def test_read_hostfile_from_disk(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(POOL_TEXT)
    assert read_hostfile(str(path))["worker-2"] == 2


@pytest.mark.parametrize("bad_line", ["worker-3", "worker-3 slots=", "worker-3 slots=x",
                                      "worker-3 gpus=4", "worker-3 slots=4 extra"])
def test_bad_line_names_file_line_and_expected_form(bad_line):
    lines = ["worker-0 slots=1\n", "\n", bad_line + "\n"]
    with pytest.raises(HostfileError) as err:
        parse_hostfile_lines(lines, source="hosts.txt")
    message = str(err.value)
    assert "hosts.txt:3" in message and "slots=<count>" in message


def test_duplicate_host_is_an_error():
    with pytest.raises(HostfileError, match=r"hf:2: host 'a' is listed twice"):
        parse_hostfile_lines(["a slots=1", "a slots=2"], source="hf")


def test_empty_hostfile_and_missing_file(tmp_path):
    with pytest.raises(HostfileError, match="no hosts found"):
        parse_hostfile_lines(["# nothing\n", "\n"])
    with pytest.raises(HostfileError, match="cannot read hostfile"):
        read_hostfile(str(tmp_path / "missing"))


def test_parse_filter_merges_and_sorts():
    assert parse_filter("a:2,0@b@a:1") == {"a": [0, 1, 2], "b": []}
    with pytest.raises(HostfileError, match="slots must be integers"):
        parse_filter("a:x")


def test_no_filter_uses_every_slot(pool):
    assert resolve_resources(pool) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3],
                                       "worker-2": [0, 1]}


def test_include_whole_host_and_slots_keeps_hostfile_order(pool):
    active = resolve_resources(pool, include="worker-2@worker-0:0,2")
    assert list(active.items()) == [("worker-0", [0, 2]), ("worker-2", [0, 1])]


def test_exclude_slot_and_whole_host(pool):
    active = resolve_resources(pool, exclude="worker-1:0@worker-2")
    assert active == {"worker-0": [0, 1, 2, 3], "worker-1": [1, 2, 3]}


@pytest.mark.parametrize("kwargs, message", [
    ({"include": "nope"}, "not in the hostfile"),
    ({"include": "worker-2:5"}, "has no slot 5"),
    ({"exclude": "worker-0:9"}, "has no slot 9"),
    ({"include": "worker-0", "exclude": "worker-1"}, "mutually exclusive"),
    ({"exclude": "worker-0@worker-1@worker-2"}, "no slots left"),
])
def test_filter_errors(pool, kwargs, message):
    with pytest.raises(HostfileError, match=message):
        resolve_resources(pool, **kwargs)


def test_limit_nodes_and_slots(pool):
    active = resolve_resources(pool)
    assert limit_resources(active, num_nodes=2) == {"worker-0": [0, 1, 2, 3],
                                                    "worker-1": [0, 1, 2, 3]}
    assert limit_resources(active, slots_per_node=1) == {"worker-0": [0], "worker-1": [0],
                                                         "worker-2": [0]}
    with pytest.raises(HostfileError, match="more hosts"):
        limit_resources(active, num_nodes=4)


def test_ranks_follow_hosts_in_order(pool):
    active = resolve_resources(pool, exclude="worker-0:1")   # worker-0 keeps 0, 2, 3
    assert world_size(active) == 9
    assert rank_layout(active, 0) == [(0, 0, 0), (1, 1, 2), (2, 2, 3)]
    assert rank_layout(active, 1) == [(3, 0, 0), (4, 1, 1), (5, 2, 2), (6, 3, 3)]
    assert rank_layout(active, 2) == [(7, 0, 0), (8, 1, 1)]
