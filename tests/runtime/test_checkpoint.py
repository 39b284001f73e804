"""Checkpoints: DCP folders keyed by block, published atomically, read without unpickling code.

The unit tests save and load in this process (DCP without a process group); one kills a process
in the middle of a save; the last one runs real ranks: periodic saves, a rank killed while saving,
and a resume from the previous checkpoint under another plan that continues the uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from builders import make_cluster, zoo_profile
from torch import nn

from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.checkpoint import (
    CHECKPOINT_SCHEMA,
    checkpoint_state,
    load_checkpoint,
    read_block,
    read_manifest,
    save_checkpoint,
)
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.precision import Precision, run_blocks
from hetplan.runtime.reference import train_reference

NAMES = ["embed", "layer0.mlp"]
MODEL = {"family": "toy", "config": {"width": 4}}
ROOT = Path(__file__).resolve().parents[2]


def _blocks(seed: int) -> dict[int, nn.Module]:
    torch.manual_seed(seed)
    return {0: nn.Linear(3, 4), 1: nn.Sequential(nn.Linear(4, 2), nn.LayerNorm(2))}


def _info(dtype: str, precision: Precision | None = None) -> dict:
    info = {"model": MODEL, "dtype": dtype, "blocks": {n: {"index": i} for i, n in enumerate(NAMES)}}
    if precision is not None:
        info["loss_scale"] = {"scale": precision.scaler.scale, "good_steps": precision.scaler.good_steps}
    return info


def _train(blocks: dict[int, nn.Module], precision: Precision, steps: int = 1) -> None:
    x = torch.linspace(-1, 1, 15).reshape(5, 3)
    for _ in range(steps):
        with precision.autocast(torch.device("cpu")):
            loss = run_blocks(list(blocks.values()), x, precision.torch_dtype).float().square().mean()
        precision.scale(loss).backward()
        for p in precision.params:
            precision.accumulate_one(p)
        precision.step(nonfinite_anywhere=precision.nonfinite())


def _model(dtype: str, seed: int, optimizer: str = "adam") -> tuple[dict[int, nn.Module], Precision]:
    blocks = _blocks(seed)
    Precision.cast_model(list(blocks.values()), dtype)
    params = [p for b in blocks.values() for p in b.parameters()]
    return blocks, Precision(dtype, params, optimizer=optimizer, lr=0.1)


def _save(root: Path, blocks, precision: Precision, step: int, dtype: str = "fp32", **kw) -> Path:
    state = checkpoint_state(blocks, precision, NAMES)
    return save_checkpoint(root, state, step=step, info=_info(dtype, precision), **kw)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_checkpoint_loads_back_weights_masters_optimizer_state_and_loss_scale(tmp_path, dtype) -> None:
    blocks, precision = _model(dtype, seed=0)
    _train(blocks, precision, steps=2)
    precision.scaler.scale, precision.scaler.good_steps = (1024.0, 7) if dtype == "fp16" else (1.0, 0)
    _save(tmp_path, blocks, precision, step=2, dtype=dtype)
    fresh, other = _model(dtype, seed=1)  # different weights, no optimizer state
    manifest = load_checkpoint(tmp_path, fresh, other, names=NAMES, model=MODEL)
    assert manifest.step == 2
    for i in blocks:
        for (name, a), (_, b) in zip(blocks[i].state_dict().items(), fresh[i].state_dict().items(), strict=True):
            assert torch.equal(a, b), name
    for p, q in zip(precision.params, other.params, strict=True):
        assert torch.equal(precision.master_of(p), other.master_of(q))  # the fp32 master copy, exactly
        mine, theirs = precision.optimizer.state[precision.master_of(p)], other.optimizer.state[other.master_of(q)]
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    if dtype == "fp16":
        assert (other.scaler.scale, other.scaler.good_steps) == (1024.0, 7)
    # and the next steps are the same steps
    _train(blocks, precision)
    _train(fresh, other)
    for p, q in zip(precision.params, other.params, strict=True):
        assert torch.equal(p, q)


def test_the_folder_holds_dcp_files_a_manifest_with_checksums_and_latest(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    first = _save(tmp_path, blocks, precision, step=2)
    assert first == tmp_path / "step-000002"
    assert (tmp_path / "latest").read_text() == "step-000002\n"
    assert sorted(p.name for p in first.iterdir()) == [".metadata", "__0_0.distcp", "manifest.json"]
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["schema"] == CHECKPOINT_SCHEMA and manifest["step"] == 2 and manifest["model"] == MODEL
    assert manifest["tool"]["name"] == "hetplan" and set(manifest["blocks"]) == set(NAMES)
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((first / name).read_bytes()).hexdigest()
    second = _save(tmp_path, blocks, precision, step=4, keep_last=1)
    assert (tmp_path / "latest").read_text() == "step-000004\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000004"]  # step 2 pruned, no .tmp
    assert read_manifest(second).step == 4


def test_one_block_reads_back_by_index_or_name(tmp_path) -> None:
    blocks, precision = _model("bf16", seed=0, optimizer="momentum")
    _train(blocks, precision)
    _save(tmp_path, blocks, precision, step=1, dtype="bf16")
    saved = read_block(tmp_path, 1)
    assert saved.name == "layer0.mlp" and set(saved.params) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert all(t.dtype == torch.bfloat16 for t in saved.params.values())
    assert all(t.dtype == torch.float32 for t in saved.master.values())
    assert set(saved.optimizer["0.weight"]) == {"momentum_buffer"}
    assert torch.equal(read_block(tmp_path, "embed").params["weight"], blocks[0].weight)


def test_the_index_is_read_without_unpickling_code(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    folder = _save(tmp_path, blocks, precision, step=1)
    marker = tmp_path / "owned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = pickle.dumps(Payload())
    pickle.loads(evil)  # what plain unpickling would do: run code
    assert marker.exists()
    marker.unlink()
    (folder / ".metadata").write_bytes(evil)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][".metadata"]["sha256"] = hashlib.sha256(evil).hexdigest()  # a consistent forgery
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HetplanError, match=r"\.metadata: not a checkpoint index .*refusing (builtins|io)\.open"):
        load_checkpoint(tmp_path, *_model("fp32", seed=1), names=NAMES)
    assert not marker.exists()


def test_damage_is_one_line_naming_the_file_and_field(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    folder = _save(tmp_path, blocks, precision, step=3)

    def fails(pattern: str, **kw) -> None:
        with pytest.raises(HetplanError, match=pattern) as info:
            load_checkpoint(tmp_path, *_model("fp32", seed=1), names=NAMES, **kw)
        assert "\n" not in str(info.value)

    data = folder / "__0_0.distcp"
    original = data.read_bytes()
    data.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    fails(r"__0_0\.distcp: manifest\.json: files\.__0_0\.distcp\.sha256: checksum mismatch")
    data.write_bytes(original)
    fails(r"manifest\.json: model: saved for another model", model={"family": "gpt"})
    text = (folder / "manifest.json").read_text()
    manifest = json.loads(text)
    (folder / "manifest.json").write_text(text[:-20])
    fails(r"step-000003/manifest\.json: corrupt: not JSON")
    del manifest["step"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    fails(r"manifest\.json: step: missing required field")
    (folder / "manifest.json").unlink()
    fails(r"step-000003/manifest\.json: missing: not a finished checkpoint")
    (tmp_path / "latest").write_text("../../etc\n")
    fails(r"latest: expected a folder name such as step-000120")


def test_blocks_and_shapes_the_checkpoint_lacks_are_refused(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    _save(tmp_path, {0: blocks[0]}, precision, step=1)  # block 0 only: block 1 is listed but has no keys
    with pytest.raises(HetplanError, match=r"\.metadata: layer0\.mlp/param/0\.weight: missing from the checkpoint"):
        load_checkpoint(tmp_path, *_model("fp32", seed=1), names=NAMES)
    wider = {0: nn.Linear(3, 5)}
    with pytest.raises(HetplanError, match=r"embed/param/weight: saved with shape \[4, 3\], this model's is \[5, 3\]"):
        load_checkpoint(
            tmp_path, wider, Precision("fp32", list(wider[0].parameters()), optimizer="sgd", lr=1.0), names=NAMES
        )
    with pytest.raises(HetplanError, match=r"manifest\.json: blocks: no block 'head' \(block 0\)"):
        load_checkpoint(tmp_path, *_model("fp32", seed=1), names=["head", "tail"])


def test_a_given_step_is_loaded_and_a_missing_one_lists_the_finished(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    _save(tmp_path, blocks, precision, step=2)
    before = blocks[0].weight.detach().clone()
    _train(blocks, precision)
    _save(tmp_path, blocks, precision, step=3)
    fresh, other = _model("fp32", seed=1)
    assert load_checkpoint(tmp_path, fresh, other, names=NAMES, step=2).step == 2
    assert torch.equal(fresh[0].weight, before)
    with pytest.raises(HetplanError, match=r"step-000005: no finished checkpoint of step 5 \(finished steps: 2, 3\)"):
        load_checkpoint(tmp_path, fresh, other, names=NAMES, step=5)
    assert load_checkpoint(tmp_path / "step-000003", fresh, other, names=NAMES).step == 3  # a step folder itself


def test_a_folder_of_the_old_pickled_format_is_refused_in_one_line(tmp_path) -> None:
    torch.save({"params": {}}, tmp_path / "block-0000.pt")
    with pytest.raises(HetplanError, match=r"an older hetplan \(block-\*\.pt files"):
        load_checkpoint(tmp_path, *_model("fp32", seed=1), names=NAMES)
    with pytest.raises(HetplanError, match=r"no such checkpoint folder"):
        load_checkpoint(tmp_path / "nowhere", *_model("fp32", seed=1), names=NAMES)


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    _save(tmp_path, blocks, precision, step=2)
    saved = {k: v.clone() for k, v in blocks[0].state_dict().items()}
    _train(blocks, precision)

    def boom() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(
        HetplanError, match=r"step-000004\.tmp: saving step-000004 failed: rank 0: RuntimeError: disk full"
    ):
        _save(tmp_path, blocks, precision, step=4, after_write=boom)
    assert (tmp_path / "latest").read_text() == "step-000002\n"
    assert (tmp_path / "step-000004.tmp" / "__0_0.distcp").is_file()  # written, never published
    fresh, other = _model("fp32", seed=1)
    assert load_checkpoint(tmp_path, fresh, other, names=NAMES).step == 2
    assert all(torch.equal(fresh[0].state_dict()[k], v) for k, v in saved.items())
    _save(tmp_path, blocks, precision, step=4)  # saving that step again starts it afresh
    assert not (tmp_path / "step-000004.tmp").exists() and read_manifest(tmp_path / "step-000004").step == 4


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(tmp_path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys, torch
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(ROOT / "tests")!r}]
        from test_checkpoint import _model, _save
        blocks, precision = _model("fp32", seed=0)
        with torch.no_grad():
            blocks[0].weight.fill_(2.0)
        _save({str(tmp_path)!r}, blocks, precision, step=2)
        with torch.no_grad():
            blocks[0].weight.fill_(4.0)
        _save({str(tmp_path)!r}, blocks, precision, step=4, after_write=lambda: os.kill(os.getpid(), signal.SIGKILL))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (tmp_path / "step-000004.tmp").is_dir() and not (tmp_path / "step-000004").exists()
    fresh, other = _model("fp32", seed=1)
    assert load_checkpoint(tmp_path, fresh, other, names=NAMES).step == 2
    assert torch.equal(fresh[0].weight, torch.full((4, 3), 2.0))


# -- real ranks ---------------------------------------------------------------------------------------

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}


def _stage(start: int, end: int, *devices: str) -> Stage:
    return Stage(start, end, devices, tuple(1.0 / len(devices) for _ in devices))


def _profile() -> ModelProfile:
    return zoo_profile(GPT)


def _config(tmp_path: Path, plan: Plan, name: str) -> tuple[Path, dict]:
    config = build_rank_config(plan, _profile(), make_cluster([("n0", [("cpu", 4)])]), seed=7, timeout_s=30)
    path = tmp_path / f"{name}.yaml"
    write_yaml(config, path)
    return path, config


def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_and_the_run_resumes_under_another_plan(
    tmp_path,
) -> None:
    first = Plan(
        global_batch=8,
        pipelines=[Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))],
        optimizer="adam",
    )
    second = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (2, 2), (_stage(0, 5, "n0/0"), _stage(5, 6, "n0/1"))),
            Pipeline(4, (4,), (_stage(0, 6, "n0/2"),)),
        ],
        optimizer="adam",
    )
    ckpt = tmp_path / "ckpt"
    path, _ = _config(tmp_path, first, "a")
    with pytest.raises(HetplanError) as info:
        launch_local(path, steps=6, save=ckpt, save_every=2, crash_in_save=(1, 4), run_dir=tmp_path / "run")
    assert "rank 1 (n0/1) died (SIGKILL)" in str(info.value)
    assert (ckpt / "latest").read_text() == "step-000002\n"
    assert not (ckpt / "step-000004").exists()  # rank 0 wrote its share, but nothing was published
    manifest = read_manifest(ckpt / "step-000002")
    # each block by its first holder: blocks 0-2 by rank 0, 3-5 by rank 1, both files in one DCP index
    assert {b["rank"] for b in manifest.data["blocks"].values()} == {0, 1}
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(manifest.files)
    path, config = _config(tmp_path, second, "b")
    resumed = launch_local(path, steps=2, resume=ckpt, save=ckpt)
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=4)
    assert [r["step"] for r in resumed.records if r["rank"] == 0] == [2, 3]
    assert [r["loss"] for r in resumed.records if r["rank"] == 0] == pytest.approx(losses[2:], abs=1e-5)
    assert (ckpt / "latest").read_text() == "step-000004\n"  # saved again under the second plan


def test_an_fp32_checkpoint_resumed_in_bf16_keeps_the_fp32_weights_as_the_master_copy(tmp_path) -> None:
    blocks, precision = _model("fp32", seed=0)
    _train(blocks, precision)
    _save(tmp_path, blocks, precision, step=1)
    fresh, other = _model("bf16", seed=1)
    load_checkpoint(tmp_path, fresh, other, names=NAMES)
    assert torch.equal(other.master_of(fresh[0].weight), blocks[0].weight)  # not rounded through bf16
    assert torch.equal(fresh[0].weight, blocks[0].weight.to(torch.bfloat16))
