"""Would it fit here? ``memagent run --fits`` and ``memagent admit`` against a real daemon
watching a real fleet: a target holding 500 MiB under a configured host capacity of 1 GiB,
and (fake NVML, tests/fakes) a GPU on which the fleet holds 60 of 80 GiB."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Target, memagent_cli, poll
from fakes.fakenvml import FakeGpuState, GiB, MiB, build_fake_nvml, nvml_env

#: Allocates the MiB given as its argument and holds them a moment.
ALLOCATES = "import sys, time; block = b'\\x01' * (int(sys.argv[1]) << 20); time.sleep(0.3)"

#: Uses the GiB given as its first argument on GPU 0 of the fake driver (its own line in
#: the state file, argv[2]) for 0.6 s (several samples at 0.1 s), then gives it back.
USES_GPU = textwrap.dedent("""
    import os, sys, time
    state, gib = sys.argv[2], int(sys.argv[1])
    original = open(state).read()

    def put(text):
        with open(state + ".tmp", "w") as f:
            f.write(text)
        os.rename(state + ".tmp", state)

    put(original + f"proc 0 compute {os.getpid()} {gib << 30}\\n")
    time.sleep(0.6)
    put(original)
""")


class Fleet:
    """A daemon with a host capacity of 1 GiB watching one 500 MiB target, and a fake GPU
    (80 GiB, 60 GiB of it the target's)."""

    def __init__(self, root: Path) -> None:
        self.state_file = root / "gpu-state"
        self.env = nvml_env(build_fake_nvml(root / "nvml"), self.state_file, root / "nvml-calls")
        self.target = Target()
        self.target.do("alloc 500")
        state = FakeGpuState()
        state.add_device("NVIDIA H100 80GB HBM3", 80 * GiB, 60 * GiB, uuid="GPU-fleet")
        state.add_proc(0, self.target.pid, 60 * GiB)
        state.write(self.state_file)
        config = root / "memagent.toml"
        config.write_text('[host]\ncapacity = "1GiB"\n')
        self.daemon = Daemon(str(root / "fleet.sock"), "--interval", "0.1", "--config", str(config), env=self.env)
        self.daemon.wait_listening()
        with self.daemon.client() as c:
            c.attach([self.target.pid], label="fleet-model")

        def counted() -> bool:
            with self.daemon.client() as c:
                return {h.resource: h.sum_peaks_bytes for h in c.status().headroom}.get("GPU-fleet") == 60 * GiB
        poll("the daemon counts the fleet's peaks", counted)

    def cli(self, *args: str) -> tuple[int, str, str]:
        r = memagent_cli("--socket", self.daemon.socket, *args, env=self.env)
        assert "Traceback" not in r.stderr
        return r.returncode, r.stdout, r.stderr

    def close(self) -> None:
        self.daemon.stop()
        self.target.kill()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    yield f
    f.close()


def run_fits(fleet: Fleet, tmp_path: Path, *cmd: str) -> tuple[int, str, dict[str, object]]:
    report = tmp_path / "report.json"
    code, _, err = fleet.cli("run", "--fits", "--report", str(report), "--", *cmd)
    return code, err, json.loads(report.read_text())


def test_run_fits_passes_when_the_fleet_leaves_enough(fleet: Fleet, tmp_path: Path) -> None:
    code, err, report = run_fits(fleet, tmp_path, sys.executable, "-c", ALLOCATES, "200")
    assert code == 0, err
    fits = report["fits"]
    assert isinstance(fits, dict) and fits["fits"] is True
    (host,) = fits["resources"]
    assert host["resource"] == "host" and host["capacity_bytes"] == 1 * GiB
    assert 200 * MiB <= host["need_bytes"] < 260 * MiB and host["watched_sum_peaks_bytes"] >= 500 * MiB
    assert "fits" in err


def test_run_fits_fails_when_the_fleet_leaves_too_little(fleet: Fleet, tmp_path: Path) -> None:
    code, err, report = run_fits(fleet, tmp_path, sys.executable, "-c", ALLOCATES, "700")
    assert code == 3, err
    fits = report["fits"]
    assert isinstance(fits, dict) and fits["fits"] is False
    (host,) = fits["resources"]
    assert host["over_by_bytes"] == host["total_bytes"] - 1 * GiB > 100 * MiB
    assert report["over_budget"] is False  # no budget was given: the box said no
    assert "(would not fit here)" in err and "host memory: 7" in err and "does NOT fit" in err
    assert f"heaviest watched there: PID {fleet.target.pid} fleet-model" in err


@pytest.mark.parametrize(("gib", "status"), [(10, 0), (30, 3)])
def test_run_fits_judges_each_gpu_the_command_used(fleet: Fleet, tmp_path: Path, gib: int, status: int) -> None:
    code, err, report = run_fits(fleet, tmp_path, sys.executable, "-c", USES_GPU, str(gib), str(fleet.state_file))
    assert code == status, err
    fits = report["fits"]
    assert isinstance(fits, dict)
    gpu = next(r for r in fits["resources"] if r["resource"] == "GPU-fleet")
    assert gpu["need_bytes"] == gib * GiB and gpu["watched_sum_peaks_bytes"] == 60 * GiB
    assert gpu["fits"] is (status == 0)


def test_run_fits_without_a_daemon_refuses_before_the_command_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = memagent_cli("run", "--fits", "--socket", str(tmp_path / "none.sock"), "--",
                     sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert r.returncode == 2 and not marker.exists()
    assert len(r.stderr.strip().splitlines()) == 1 and "no memagent daemon" in r.stderr


def test_admit_answers_both_ways(fleet: Fleet) -> None:
    code, out, _ = fleet.cli("admit", "--rss", "300MiB")
    assert code == 0 and out.startswith("RSS 300 MiB: fits"), out
    code, out, _ = fleet.cli("admit", "--rss", "600MiB", "--json")
    assert code == 3
    answer = json.loads(out)
    assert answer["fits"] is False and answer["rss_bytes"] == 600 * MiB and answer["gpu"] is None
    (host,) = answer["resources"]
    assert host["top"][0]["pid"] == fleet.target.pid and host["over_by_bytes"] > 0


@pytest.mark.parametrize(("args", "status", "gpu"), [
    (["--vram", "10GiB"], 0, "GPU-fleet"),  # any GPU: the only one has room
    (["--vram", "30GiB"], 3, "GPU-fleet"),
    (["--vram", "10GiB", "--gpu", "0"], 0, "GPU-fleet"),
    (["--vram", "30GiB", "--gpu", "GPU-fleet"], 3, "GPU-fleet"),
])
def test_admit_judges_gpu_memory(fleet: Fleet, args: list[str], status: int, gpu: str) -> None:
    code, out, err = fleet.cli("admit", "--rss", "1MiB", *args, "--json")
    assert code == status, err
    answer = json.loads(out)
    assert answer["gpu"] == gpu and answer["fits"] is (status == 0)
    judged = {r["resource"]: r for r in answer["resources"]}
    assert judged["GPU-fleet"]["watched_sum_peaks_bytes"] == 60 * GiB and judged["host"]["fits"] is True


def test_admit_takes_the_peaks_of_a_run_report(fleet: Fleet, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    r = memagent_cli("run", "--report", str(report), "--", sys.executable, "-c", ALLOCATES, "700")
    assert r.returncode == 0, r.stderr
    code, out, _ = fleet.cli("admit", "--report", str(report))
    assert code == 3 and "does NOT fit" in out


@pytest.mark.parametrize(("args", "status", "words"), [
    (["--report", "/nonexistent/report.json"], 1, "cannot read"),
    (["--report", "/etc/hostname"], 1, "not a memagent run report"),
    (["--rss", "1MiB", "--vram", "1GiB", "--gpu", "7"], 1, "sees no GPU 7"),
    (["--rss", "1MiB", "--gpu", "0"], 2, "--gpu needs --vram"),
    (["--rss", "lots"], 2, "--rss"),
])
def test_admit_bad_input_one_line(fleet: Fleet, args: list[str], status: int, words: str) -> None:
    code, _, err = fleet.cli("admit", *args)
    assert code == status and len(err.strip().splitlines()) == 1 and words in err, err


def test_admit_without_a_daemon(tmp_path: Path) -> None:
    r = memagent_cli("admit", "--rss", "1G", "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 2 and "no memagent daemon" in r.stderr
