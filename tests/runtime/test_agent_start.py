"""The agent forked from the launching process's fork server (``HETPLAN_RANK_START=forkserver``):
the calling script is not run again in it, and ``multiprocessing``'s sockets find a path short
enough where ``TMPDIR`` is long (docs/runtime.md, "How ranks start")."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from pathlib import Path
import sys
sys.path.insert(0, {tests!r})
with open({marks!r}, "a") as f:
    f.write("top\\n")  # no main guard: this line runs in whatever imports this script as a module
from builders import make_cluster, zoo_profile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.launcher import launch_local

profile = zoo_profile({{"family": "gpt", "config": {{"layers": 1, "hidden": 16, "heads": 2, "seq": 4, "vocab": 11}}}})
plan = Plan(global_batch=2, pipelines=[Pipeline(2, (1, 1), (Stage(0, 4, ("n0/0",), (1.0,)),))])
config = Path({folder!r}) / "rank-config.yaml"
write_yaml(build_rank_config(plan, profile, make_cluster([("n0", [("cpu", 1)])]), seed=1, timeout_s=60), config)
launch_local(config, steps=1, log=Path({folder!r}) / "run.jsonl")
"""


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def test_a_script_without_a_main_guard_launches_once(tmp_path) -> None:
    marks = tmp_path / "marks.txt"
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), marks=str(marks), folder=str(tmp_path)))
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=_env(HETPLAN_RANK_START="forkserver"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marks.read_text() == "top\n"  # the agent did not import the script again
    assert (tmp_path / "run.jsonl").read_text().count("\n") == 1  # one step, one rank


def test_multiprocessing_sockets_go_under_tmp_only_where_tmpdir_is_too_long(tmp_path) -> None:
    code = textwrap.dedent("""
        from multiprocessing import util
        from hetplan.runtime.processes.fork_server import short_socket_folder
        short_socket_folder()
        print(util.get_temp_dir())
    """)
    long_dir = tmp_path / ("x" * 80)
    long_dir.mkdir()
    short_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    for tmpdir, expected_parent in ((long_dir, Path("/tmp")), (short_dir, short_dir)):
        out = subprocess.run(
            [sys.executable, "-c", code], env=_env(TMPDIR=str(tmpdir)), capture_output=True, text=True, check=True
        ).stdout.strip()
        assert Path(out).parent == expected_parent, (tmpdir, out)
        assert len(out) + len("/listener-xxxxxxxx") < 108  # a UNIX socket's path limit
    short_dir.rmdir()  # multiprocessing removed its own folder in it at exit
