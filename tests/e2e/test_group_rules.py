"""The rules of ``attach --cgroup/--unit/--container`` outlive a restart (kept in the state
directory with the watched set, each with its owner's rights) and ``detach --cgroup/--unit/
--container`` ends them: real cgroups, real daemons, real targets."""

from __future__ import annotations

import json
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Daemon, Target, as_user, memagent_cli, poll
from test_containers_e2e import MakeCgroup, make_cgroup  # noqa: F401 - the fixture, shared

from memagent.client import Client
from memagent.core.groups import GroupRule
from memproto.client_side import RequestFailed


def _pids(d: Daemon) -> set[int]:
    r = memagent_cli("--socket", d.socket, "ls", "--json")
    assert r.returncode == 0, r.stderr
    return {p["pid"] for p in json.loads(r.stdout) if p["alive"]}


def _saved_rules(state: Path) -> list[dict[str, object]]:
    try:
        return list(json.loads((state / "state.json").read_text()).get("rules", []))
    except (FileNotFoundError, ValueError):
        return []


def test_a_group_rule_outlives_a_restart_and_detach_ends_it(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup,  # noqa: F811
    tmp_path: Path,
) -> None:
    models, models_path = make_cgroup("models.slice")
    other, other_path = make_cgroup("other.slice")
    state = tmp_path / "state"
    flags = ("--state-dir", str(state), "--interval", "0.1", "--no-gpu")
    d = start_daemon(*flags)
    r = memagent_cli("--socket", d.socket, "attach", "--cgroup", models_path, "--label", "models")
    assert r.returncode == 0, r.stderr
    poll("the rule saved", lambda: _saved_rules(state))
    d.stop()  # SIGTERM

    d = start_daemon(*flags, socket=d.socket)
    parent = make_target()
    (models / "cgroup.procs").write_text(str(parent.pid))
    (child,) = map(int, parent.do("fork"))  # born in the group after the restart
    poll("a process started in the group after the restart is attached", lambda: child in _pids(d))
    later = parent if parent.pid in _pids(d) else None
    row = next(p for p in json.loads(memagent_cli("--socket", d.socket, "ls", "--json").stdout)
               if p["pid"] == child)
    assert row["label"] == "models" and row["cgroup"] == models_path

    r = memagent_cli("--socket", d.socket, "detach", "--cgroup", models_path)
    assert r.returncode == 0, r.stderr
    assert f"detached {child}" in r.stdout and "ended 1 --cgroup rule(s)" in r.stdout
    assert child not in _pids(d) and (later is None or later.pid not in _pids(d))
    poll("the rule's end saved", lambda: not _saved_rules(state))
    # Ended: a process moved in now is not attached. The witness: a rule still in force, for
    # another group, attaches its newcomer in the same scan.
    assert memagent_cli("--socket", d.socket, "attach", "--cgroup", other_path).returncode == 0
    # Newcomers are children forked inside each group (new PIDs, born there, for the scan).
    inside, witness = make_target(), make_target()
    (models / "cgroup.procs").write_text(str(inside.pid))
    (other / "cgroup.procs").write_text(str(witness.pid))
    (late,), (seen,) = map(int, inside.do("fork")), map(int, witness.do("fork"))
    poll("the other group's newcomer attached", lambda: seen in _pids(d))
    assert late not in _pids(d)
    # Nothing left to end: one line, exit 1.
    r = memagent_cli("--socket", d.socket, "detach", "--cgroup", models_path)
    assert r.returncode == 1 and r.stderr.startswith("memagent detach: no rule of yours"), r


def test_a_saved_rule_keeps_its_owners_rights_and_bad_ones_are_refused() -> None:
    mine = GroupRule.from_json({"kind": "unit", "value": "web.service", "label": "web", "trusted": False,
                                "owner": 1000})
    assert mine.may_watch(1000) and not mine.may_watch(0)  # a user's rule never takes root's processes
    everyone = GroupRule.from_json(GroupRule("cgroup", "/models", None).to_json())
    assert everyone.may_watch(0) and everyone.may_watch(1000) and everyone.owner is None
    for bad in ({"kind": "pid", "value": "1", "label": None, "trusted": True, "owner": None},
                {"kind": "unit", "value": "", "label": None, "trusted": True, "owner": None},
                {"kind": "unit", "value": "x", "label": "bad label\n", "trusted": True, "owner": None},
                {"kind": "unit", "value": "x", "label": None, "trusted": "yes", "owner": None},
                {"kind": "unit", "value": "x", "label": None, "trusted": True, "owner": -1},
                {"kind": "unit", "value": "x", "label": None, "trusted": True, "owner": True},
                {"kind": "cgroup", "value": "/" + "x" * 5000, "label": None, "trusted": True, "owner": None}, []):
        try:
            GroupRule.from_json(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_detach_by_group_usage_errors(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    r = memagent_cli("--socket", d.socket, "detach", "--unit", "a.service", "--cgroup", "/x")
    assert r.returncode == 2 and "not allowed with" in r.stderr, r
    r = memagent_cli("--socket", d.socket, "detach")
    assert r.returncode == 2 and "give PIDs, --exited, --cgroup, --unit or --container" in r.stderr, r
    with d.client() as c, pytest.raises(RequestFailed, match="at most one"):
        c.detach([], unit="")


def test_another_user_cannot_end_roots_rule_and_a_users_rule_restarts_with_its_rights(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup,  # noqa: F811
    test_user: pwd.struct_passwd, shared_dir: str, tmp_path: Path,
) -> None:
    roots, roots_path = make_cgroup("roots.slice")
    users, users_path = make_cgroup("users.slice")
    state = tmp_path / "state"
    flags = ("--state-dir", str(state), "--interval", "0.1", "--no-gpu", "--socket-group", test_user.pw_name)
    d = start_daemon(*flags, socket=f"{shared_dir}/m.sock")
    with d.client() as c:
        c.attach([], cgroup=roots_path)

    def theirs() -> object:
        with Client(d.socket) as c:
            c.attach([], cgroup=users_path, label="mine")
            return c.detach([], cgroup=roots_path).rules_ended  # root's rule: not theirs to end

    assert as_user(test_user, theirs) == 0
    poll("both rules saved", lambda: len(_saved_rules(state)) == 2)
    assert {(r["value"], r["owner"]) for r in _saved_rules(state)} == {(roots_path, None),
                                                                       (users_path, test_user.pw_uid)}
    d.stop()
    d = start_daemon(*flags, socket=d.socket)
    # After the restart the user's rule attaches the user's processes only: a root process in
    # its group is not taken, while root's rule (the witness) takes root's newcomer.
    root_in_users, witness = make_target(), make_target()
    (users / "cgroup.procs").write_text(str(root_in_users.pid))
    (roots / "cgroup.procs").write_text(str(witness.pid))
    (late,), (seen,) = map(int, root_in_users.do("fork")), map(int, witness.do("fork"))
    poll("root's rule took its newcomer", lambda: seen in _pids(d))
    assert late not in _pids(d)
