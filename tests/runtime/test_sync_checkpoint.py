"""Checkpoints of wsp and sdpipe runs: saved at step k and resumed, a run goes on with the losses of
an uninterrupted one (gloo, CPU, a small zoo GPT).

wsp: the parameter server writes the newest weights and its optimizer state, the devices their
buffers. sdpipe: every pipeline's own weights and optimizer state (they differ between averaging
rounds and always in the optimizer's moments), plus one copy under the plain block names.
"""

from __future__ import annotations

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.checkpoint import read_block, read_manifest, resolve_checkpoint
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}

#: a two-stage pipeline (transfers) and a one-device one, unequal batches
PIPELINES = [
    Pipeline(5, (2, 3), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,)))),
    Pipeline(3, (3,), (Stage(0, 6, ("n0/2",), (1.0,)),)),
]
#: sdpipe's pipelines share one structure (each device averages with its counterpart)
TWO_STAGE = [
    Pipeline(5, (2, 3), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,)))),
    Pipeline(3, (3,), (Stage(0, 3, ("n0/2",), (1.0,)), Stage(3, 6, ("n0/3",), (1.0,)))),
]


def _config(tmp_path, plan: Plan, name: str = "rank-config.yaml"):
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, zoo_profile(GPT), cluster, seed=3, backend="gloo", timeout_s=60)
    path = tmp_path / name
    write_yaml(config, path)
    return path


def _losses(result) -> dict[tuple[int, str], float]:
    return {(r["step"], r["device"]): r["loss"] for r in result.records}


def _whole_and_first(tmp_path, plan: Plan, *, steps: int, at: int) -> tuple:
    """The uninterrupted run of ``steps`` steps and a run of the first ``at`` steps that saves
    (one launch each): (rank config, whole run's losses, first run's losses, checkpoint folder)."""
    path = _config(tmp_path, plan)
    whole = _losses(launch_local(path, steps=steps))
    ckpt = tmp_path / "ckpt"
    first = _losses(launch_local(path, steps=at, save=ckpt))
    return path, whole, first, ckpt


def _resumed_equals_uninterrupted(saved: tuple, *, steps: int, at: int) -> None:
    path, whole, first, ckpt = saved
    assert read_manifest(resolve_checkpoint(ckpt)).step == at
    rest = _losses(launch_local(path, steps=steps - at, resume=ckpt))
    assert sorted(first) == sorted(k for k in whole if k[0] < at)
    assert sorted(rest) == sorted(k for k in whole if k[0] >= at)
    for key, loss in {**first, **rest}.items():
        assert loss == pytest.approx(whole[key], abs=1e-6), key
    # and the run trains: a resume that restarted from the initial weights would not match
    assert whole[(steps - 1, "n0/1")] != pytest.approx(whole[(0, "n0/1")], abs=1e-4)


#: sdpipe's run: 5 steps uninterrupted, the first 2 saved
SDPIPE_STEPS, SDPIPE_AT = 5, 2


@pytest.fixture(scope="module")
def sdpipe_saved(tmp_path_factory) -> tuple:
    """sdpipe's uninterrupted run and its first steps, saved: launched once for the module, as two
    tests resume from that checkpoint (neither writes to it)."""
    plan = Plan(global_batch=8, pipelines=TWO_STAGE, optimizer="adam", sync="sdpipe", sync_options={"group_size": 2})
    return _whole_and_first(tmp_path_factory.mktemp("sdpipe"), plan, steps=SDPIPE_STEPS, at=SDPIPE_AT)


def test_wsp_resumed_continues_as_uninterrupted(tmp_path) -> None:
    plan = Plan(global_batch=8, pipelines=PIPELINES, optimizer="adam", sync="wsp", sync_options={"wave": 2})
    _resumed_equals_uninterrupted(_whole_and_first(tmp_path, plan, steps=6, at=4), steps=6, at=4)
    # the server's Adam state is in the checkpoint, keyed by block
    saved = read_block(tmp_path / "ckpt", 0)
    assert saved.optimizer and all("exp_avg" in s for s in saved.optimizer.values())


def test_sdpipe_resumed_continues_as_uninterrupted(sdpipe_saved) -> None:
    _resumed_equals_uninterrupted(sdpipe_saved, steps=SDPIPE_STEPS, at=SDPIPE_AT)
    # each pipeline's own optimizer state: they differ (each stepped on its own gradients)
    ckpt = sdpipe_saved[3]
    p0, p1 = read_block(ckpt, "embedding@p0"), read_block(ckpt, "embedding@p1")
    name = next(iter(p0.optimizer))
    assert not torch.equal(p0.optimizer[name]["exp_avg"], p1.optimizer[name]["exp_avg"])
    plain = read_block(ckpt, "embedding")
    torch.testing.assert_close(plain.optimizer[name]["exp_avg"], p0.optimizer[name]["exp_avg"])


def test_wsp_saves_only_at_a_wave_end(tmp_path) -> None:
    plan = Plan(global_batch=8, pipelines=PIPELINES, optimizer="adam", sync="wsp", sync_options={"wave": 2})
    path = _config(tmp_path, plan)
    with pytest.raises(HetplanError) as err:
        launch_local(path, steps=3, save=tmp_path / "ckpt")
    text = str(err.value)
    assert "wave's end" in text and "--steps" in text and "\n" not in text


def test_an_sdpipe_checkpoint_resumes_under_another_mode(tmp_path, sdpipe_saved) -> None:
    """The sdpipe run's checkpoint after 2 steps (shared with the test above) resumed under the all-reduce."""
    other = Plan(global_batch=8, pipelines=TWO_STAGE, optimizer="adam")  # the all-reduce: the plain block names
    result = launch_local(_config(tmp_path, other, "allreduce.yaml"), steps=1, resume=sdpipe_saved[3])
    assert {r["step"] for r in result.records} == {SDPIPE_AT}
