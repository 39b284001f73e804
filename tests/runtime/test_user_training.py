"""Your model, your data: a user's dataset module, AdamW, global-norm clipping, warm-up + cosine.

Multi-process runs (gloo, one process per device) against the single-process reference: losses and
every parameter within 1e-5 (fp32), the run log's ``lr`` and ``grad_norm`` equal to the reference's.
The reference clips with ``torch.nn.utils.clip_grad_norm_`` over the whole model in one process, so
these tests check the runtime's norm across pipelines and replicas, not the same code twice.
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import pytest
import torch
from builders import make_cluster

from hetplan.contracts.lr_schedule import LrSchedule
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import load_rank_config
from hetplan.contracts.runlog import parse_record
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.dataset import UserDataset
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.optim import clip_coefficient
from hetplan.runtime.precision import Precision
from hetplan.runtime.reference import train_reference


@pytest.fixture(autouse=True)
def one_thread_as_the_ranks():
    """The single-process references run on one thread, as each rank does (``--threads 1``): a
    convolution's weight gradient sums in another order on two threads (3e-6 of its largest entry
    on an AMD EPYC here), and BatchNorm on tiny maps grows that past 1e-5 in two steps."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
SEED = 7

#: A user's dataset module: GPT token windows (input = 8 ids, target = the next 8), each read logged
#: per rank so a test can see who read what; and the ways a dataset can be wrong.
DATASET_MODULE = """
import os

import torch
from torch.utils.data import Dataset, IterableDataset


class Windows(Dataset):
    def __init__(self, size, log=None, seq=8, vocab=31, dtype=torch.long, pair=True, broken_item=False):
        g = torch.Generator().manual_seed(1234)
        self.rows = torch.randint(0, vocab, (size, seq + 1), generator=g)
        self.log, self.dtype, self.pair, self.broken_item = log, dtype, pair, broken_item

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        if self.broken_item:
            raise KeyError(i)
        if self.log:
            with open(os.path.join(self.log, "reads-" + os.environ.get("RANK", "ref") + ".txt"), "a") as f:
                f.write(str(i) + "\\n")
        row = self.rows[i]
        if not self.pair:
            return row[:-1], row[1:], 0
        return row[:-1].to(self.dtype), row[1:]


def build(size=20, log=None):
    return Windows(size, log)


def wrong_shape():
    return Windows(20, seq=7)


def float_tokens():
    return Windows(20, dtype=torch.float32)


def out_of_vocab():
    return Windows(20, vocab=40)


def triples():
    return Windows(20, pair=False)


def unreadable():
    return Windows(20, broken_item=True)


def short():
    return Windows(5)


class Stream(IterableDataset):
    def __iter__(self):
        return iter([])


def iterable():
    return Stream()


def number():
    return 42


def failing():
    raise RuntimeError("no data here\\nsecond line")
"""


@pytest.fixture
def data_module(tmp_path, monkeypatch) -> str:
    """A fresh, uniquely named dataset module in ``tmp_path``, importable here and by the ranks
    (through PYTHONPATH, which the launcher passes on)."""
    name = f"user_data_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(DATASET_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return name


def _profile(model: dict) -> ModelProfile:
    zoo = resolve_model(model)
    timing = {"cpu": {1: Timing(1.0, 1.0)}}
    blocks = [Block(n, "zoo", 0, 0.0, 0.0, 0.0, 0.0, timing) for n in zoo.block_names()]
    return ModelProfile(model=zoo.model, dtype="fp32", blocks=blocks)


def _stage(start: int, end: int, *devices: str, shares: tuple[float, ...] | None = None) -> Stage:
    return Stage(start, end, devices, shares or tuple(1.0 / len(devices) for _ in devices))


def _plan(pipelines: list[Pipeline], *, optimizer: str = "sgd", dtype: str | None = None) -> Plan:
    plan = Plan(global_batch=sum(p.batch for p in pipelines), pipelines=pipelines, optimizer=optimizer)
    plan.dtype = dtype
    return plan


def _launch(folder: Path, plan: Plan, *, steps: int, devices: int = 4, **kw):
    """Write the rank config (``kw`` are build_rank_config's) and run every rank here."""
    run = {k: kw.pop(k) for k in ("save", "resume") if k in kw}
    profile = _profile(GPT)
    if plan.dtype:
        profile.dtype = plan.dtype
    cluster = make_cluster([("n0", [("cpu", devices)])])
    config = build_rank_config(plan, profile, cluster, seed=SEED, backend="gloo", timeout_s=60, **kw)
    path = folder / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, **run), config


def _assert_params_equal(ckpt: Path, blocks: list[torch.nn.Module], *, atol: float = 1e-5) -> None:
    for i, block in enumerate(blocks):
        saved = read_block(ckpt, i).params
        for name, value in block.state_dict().items():
            torch.testing.assert_close(saved[name], value.detach(), atol=atol, rtol=0)


def _by_step(records: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in records:
        out.setdefault(r["step"], []).append(r)
    return out


# -- the learning-rate schedule, clipping, the optimizer: one process ---------------------------------
@pytest.mark.parametrize(("warmup", "decay", "min_lr"), [(3, 5, 1e-4), (0, 4, 0.0), (2, 0, 0.0), (0, 0, 0.0)])
def test_the_schedule_is_lambda_lr_with_its_factor(warmup: int, decay: int, min_lr: float) -> None:
    schedule = LrSchedule(lr=1e-3, warmup_steps=warmup, decay_steps=decay, min_lr=min_lr)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)
    for step in range(12):
        assert schedule.lr_at(step) == optimizer.param_groups[0]["lr"], step
        optimizer.step()
        lambda_lr.step()
    # the shape: 0 at the start of a warm-up, the peak after it, the floor from W + T on
    assert schedule.lr_at(warmup) == pytest.approx(1e-3)
    if warmup:
        assert schedule.lr_at(0) == 0.0 and schedule.lr_at(warmup - 1) < 1e-3
    if decay:
        assert schedule.lr_at(warmup + decay) == pytest.approx(min_lr)
        assert schedule.lr_at(warmup + decay + 7) == pytest.approx(min_lr)
        middle = schedule.lr_at(warmup + decay / 2) if decay % 2 == 0 else None
        assert middle is None or middle == pytest.approx((1e-3 + min_lr) / 2)
    else:
        assert schedule.lr_at(warmup + 50) == 1e-3


def test_clip_coefficient_is_clip_grad_norm_s() -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 7, 11)]
    grads = [torch.randn(p.shape, generator=g) for p in params]
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad.clone()
    norm = float(torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=False))
    coef = clip_coefficient(norm, 0.5)
    assert coef < 1.0
    for p, grad in zip(params, grads, strict=True):
        torch.testing.assert_close(p.grad, grad * coef, atol=1e-7, rtol=0)
    assert clip_coefficient(norm, 100.0) == 1.0 and clip_coefficient(norm, None) == 1.0
    assert clip_coefficient(math.inf, 0.5) == 1.0  # an overflow is skipped, not clipped


def test_fp16_unscales_before_clipping() -> None:
    # a gradient of (3, 4) (norm 5) held scaled by 2^16 in the fp32 buffer
    params = [torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))]
    precision = Precision("fp16", params, optimizer="sgd", lr=1.0)
    scale = precision.scaler.scale
    precision.main_grads[0].copy_(torch.tensor([3.0, 4.0]) * scale)
    norm = math.sqrt(float(precision.grad_sq_sum(params))) / scale
    assert norm == pytest.approx(5.0)
    coef = clip_coefficient(norm, 1.0)
    assert precision.step(nonfinite_anywhere=0, clip_coef=coef)
    # SGD at lr 1 moves the weights by the clipped gradient, (0.6, 0.8)
    assert params[0].float().tolist() == pytest.approx([-0.6, -0.8], abs=1e-3)


def test_adamw_decays_the_weights_and_the_default_is_stated() -> None:
    from hetplan.runtime.optim import DEFAULT_WEIGHT_DECAY, make_optimizer

    p = torch.nn.Parameter(torch.ones(2))
    optimizer = make_optimizer("adamw", [p], 0.1)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == DEFAULT_WEIGHT_DECAY == 0.01
    assert optimizer.param_groups[0]["foreach"] is False
    p.grad = torch.zeros(2)
    optimizer.step()  # no gradient: only the decoupled decay moves the weight
    assert p.tolist() == pytest.approx([1 - 0.1 * 0.01] * 2)


# -- the dataset: order, reading only what is asked, bad inputs --------------------------------------
def test_steps_walk_seeded_epoch_permutations(data_module: str) -> None:
    zoo = resolve_model(GPT)
    data = UserDataset(f"{data_module}:build", {"size": 20}, zoo=zoo, global_batch=8, seed=SEED)
    assert data.steps_per_epoch == 2
    epoch0 = data.indices(0, 0, 8) + data.indices(1, 0, 8)
    assert len(set(epoch0)) == 16 and set(epoch0) <= set(range(20))  # no sample twice in an epoch
    assert data.indices(2, 0, 8) != data.indices(0, 0, 8)  # a new epoch, a new order
    again = UserDataset(f"{data_module}:build", {"size": 20}, zoo=zoo, global_batch=8, seed=SEED)
    assert again.indices(5, 0, 8) == data.indices(5, 0, 8)  # deterministic in (seed, epoch)
    assert data.indices(3, 2, 5) == data.indices(3, 0, 8)[2:5]
    inputs, targets = data.read(3, 2, 5)
    whole_inputs, whole_targets = data.read(3, 0, 8)
    assert torch.equal(inputs, whole_inputs[2:5]) and torch.equal(targets, whole_targets[2:5])
    assert inputs.dtype == torch.long and inputs.shape == (3, 8)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("nowhere_module_x:build", "cannot import module 'nowhere_module_x'"),
        ("{m}:missing", "has no attribute 'missing'"),
        ("{m}", "expected a dataset as 'package.module:function'"),
        ("{m}:failing", "failed (RuntimeError: no data here)"),
        ("{m}:number", "returned a int; expected a map-style dataset"),
        ("{m}:iterable", "returned a Stream; expected a map-style dataset"),
        ("{m}:short", "has 5 samples; a step needs a global batch of 8"),
        ("{m}:wrong_shape", "the input has shape [7]; the model takes [8]"),
        ("{m}:float_tokens", "the input is torch.float32; the model takes integer ids"),
        ("{m}:out_of_vocab", "; the model takes ids in [0, 31)"),
        ("{m}:triples", "is a tuple of 3; expected an (input, target) pair"),
        ("{m}:unreadable", "reading it failed (KeyError"),
    ],
)
def test_a_bad_dataset_is_one_located_line(data_module: str, factory: str, message: str) -> None:
    with pytest.raises(HetplanError) as info:
        data = UserDataset(factory.format(m=data_module), None, zoo=resolve_model(GPT), global_batch=8, seed=SEED)
        data.read(0, 0, 8)
    text = str(info.value)
    assert text.startswith("--dataset: ") and "\n" not in text
    assert message in text


def test_a_bad_dataset_stops_the_run_with_one_line(tmp_path, data_module: str) -> None:
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))])
    with pytest.raises(HetplanError) as info:
        _launch(tmp_path, plan, steps=2, devices=2, dataset=f"{data_module}:wrong_shape")
    text = str(info.value)
    assert "\n" not in text and "--dataset" in text and "the input has shape [7]; the model takes [8]" in text


# -- the rank config and the run log carry the settings -----------------------------------------------
def test_the_rank_config_carries_the_settings(tmp_path) -> None:
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 6, "n0/0"),))])
    profile, cluster = _profile(GPT), make_cluster([("n0", [("cpu", 1)])])
    config = build_rank_config(
        plan,
        profile,
        cluster,
        optimizer="adamw",
        weight_decay=0.05,
        clip_grad_norm=1.5,
        warmup_steps=10,
        decay_steps=90,
        min_lr=1e-5,
        dataset="pkg.mod:build",
        dataset_kwargs={"root": "data/"},
    )
    training = config["training"]
    assert training["optimizer"] == "adamw" and training["lr"] == 1e-3 and training["weight_decay"] == 0.05
    assert training["lr_schedule"] == {"warmup_steps": 10, "decay_steps": 90, "min_lr": 1e-5}
    write_yaml(config, tmp_path / "rank-config.yaml")
    loaded = load_rank_config(tmp_path / "rank-config.yaml")
    assert (loaded.optimizer, loaded.weight_decay, loaded.clip_grad_norm) == ("adamw", 0.05, 1.5)
    assert loaded.lr_by_step() == LrSchedule(1e-3, 10, 90, 1e-5)
    assert (loaded.dataset, loaded.dataset_kwargs) == ("pkg.mod:build", {"root": "data/"})
    # none of them given: today's training section, a constant rate
    plain = build_rank_config(plan, profile, cluster)["training"]
    assert not {"weight_decay", "clip_grad_norm", "lr_schedule", "dataset", "dataset_kwargs"} & set(plain)
    write_yaml(build_rank_config(plan, profile, cluster), tmp_path / "plain.yaml")
    assert load_rank_config(tmp_path / "plain.yaml").lr_by_step().constant


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weight_decay": 0.1}, "--weight-decay"),  # the plan's optimizer is sgd
        ({"min_lr": 1.0, "decay_steps": 5}, "--min-lr"),  # above the rate
        ({"min_lr": 1e-4}, "--min-lr"),  # a floor with no decay
        ({"data": "book.txt", "dataset": "m:build"}, "--dataset"),
        ({"dataset_kwargs": {"a": 1}}, "--dataset-kwargs"),
        ({"optimizer": "lamb"}, "--optimizer"),
    ],
)
def test_contradicting_settings_are_refused_when_emitting(kwargs: dict, field: str) -> None:
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 6, "n0/0"),))])
    with pytest.raises(HetplanError) as info:
        build_rank_config(plan, _profile(GPT), make_cluster([("n0", [("cpu", 1)])]), **kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"weight_decay": 0.1}, "training.weight_decay"),  # sgd
        ({"clip_grad_norm": 0}, "training.clip_grad_norm"),
        ({"lr_schedule": {"warmup_steps": -1}}, "training.lr_schedule.warmup_steps"),
        ({"lr_schedule": {"min_lr": 1.0}}, "training.lr_schedule.min_lr"),
        ({"lr_schedule": {"warmup": 3}}, "training.lr_schedule.warmup"),
        ({"dataset": "m:build", "data": "book.txt"}, "training.dataset"),
        ({"optimizer": "lamb"}, "training.optimizer"),
    ],
)
def test_a_bad_rank_config_setting_is_located(tmp_path, change: dict, where: str) -> None:
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 6, "n0/0"),))])
    config = build_rank_config(plan, _profile(GPT), make_cluster([("n0", [("cpu", 1)])]))
    config["training"].update(change)
    write_yaml(config, tmp_path / "rank-config.yaml")
    with pytest.raises(HetplanError) as info:
        load_rank_config(tmp_path / "rank-config.yaml")
    assert info.value.field == where


def test_the_run_log_validates_the_new_keys() -> None:
    base = {
        "schema": "hetplan/run-log/v1",
        "step": 0,
        "rank": 0,
        "pipeline": 0,
        "stage": 0,
        "device": "n0/0",
        "iteration_s": 1.0,
        "compute_s": 1.0,
        "wait_s": 0.0,
        "comm_s": 0.0,
        "loss": 1.0,
        "peak_memory_bytes": None,
    }
    record = parse_record({**base, "lr": 1e-3, "grad_norm": 2.5, "clipped": True}, file="run.jsonl", line=1)
    assert (record.lr, record.grad_norm, record.clipped) == (1e-3, 2.5, True)
    assert parse_record({**base, "grad_norm": None}, file="run.jsonl", line=1).grad_norm is None
    for bad, field in (({"lr": -1}, "lr"), ({"grad_norm": "big"}, "grad_norm"), ({"clipped": 1}, "clipped")):
        with pytest.raises(HetplanError) as info:
            parse_record({**base, **bad}, file="run.jsonl", line=3)
        assert info.value.field == f"line 3.{field}"


# -- end to end: every rank here, against the one-process reference ---------------------------------
def test_a_user_dataset_trains_end_to_end_each_rank_reading_only_its_samples(
    tmp_path, data_module: str, monkeypatch
) -> None:
    # importable from the working directory only, as for a user running the hetplan console script
    monkeypatch.delenv("PYTHONPATH")
    monkeypatch.chdir(tmp_path)
    reads = tmp_path / "reads"
    reads.mkdir()
    kwargs = {"size": 20, "log": str(reads)}  # 2 steps an epoch: step 2 starts a new permutation
    plan = _plan(
        [
            Pipeline(5, (2, 3), (_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1"), _stage(4, 6, "n0/2"))),
            Pipeline(3, (1, 2), (_stage(0, 6, "n0/3"),)),
        ],
        optimizer="adam",
    )
    steps = 3
    result, config = _launch(
        tmp_path, plan, steps=steps, save=tmp_path / "ckpt", dataset=f"{data_module}:build", dataset_kwargs=kwargs
    )
    ranks = {r["device"]: r["rank"] for r in result.records}
    read_by = {
        device: [int(x) for x in (reads / f"reads-{rank}.txt").read_text().split()]
        if (reads / f"reads-{rank}.txt").exists()
        else []
        for device, rank in ranks.items()
    }
    # each rank read exactly its samples, micro-batch by micro-batch, step by step; the middle stage none
    data = UserDataset(f"{data_module}:build", kwargs, zoo=resolve_model(GPT), global_batch=8, seed=SEED)
    first_pipeline = [i for s in range(steps) for lo, hi in ((0, 2), (2, 5)) for i in data.indices(s, lo, hi)]
    second_pipeline = [i for s in range(steps) for lo, hi in ((5, 6), (6, 8)) for i in data.indices(s, lo, hi)]
    assert read_by == {"n0/0": first_pipeline, "n0/1": [], "n0/2": first_pipeline, "n0/3": second_pipeline}
    (reads / "reads-ref.txt").unlink(missing_ok=True)
    losses, blocks = train_reference(
        GPT,
        global_batch=8,
        optimizer="adam",
        lr=config["training"]["lr"],
        seed=SEED,
        steps=steps,
        dataset=f"{data_module}:build",
        dataset_kwargs=kwargs,
    )
    # the reference read the same samples in the same order: the whole global batch of each step
    assert [int(x) for x in (reads / "reads-ref.txt").read_text().split()] == [
        i for s in range(steps) for i in data.indices(s, 0, 8)
    ]
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    _assert_params_equal(tmp_path / "ckpt", blocks)


#: Pipelines cut differently (at 2 and at 4) with unequal shares and a replicated first stage.
CUT_DIFFERENTLY = [
    Pipeline(5, (2, 3), (_stage(0, 2, "n0/0", "n0/1", shares=(0.6, 0.4)), _stage(2, 6, "n0/2"))),
    Pipeline(3, (1, 2), (_stage(0, 4, "n0/3"), _stage(4, 6, "n0/4"))),
]
TRAINING = {
    "lr": 1e-2,
    "weight_decay": 0.1,
    "clip_grad_norm": 0.05,
    "warmup_steps": 2,
    "decay_steps": 3,
    "min_lr": 1e-3,
}


def _reference_of(config: dict, steps: int, *, dtype: str = "fp32", history: list | None = None):
    t = config["training"]
    schedule = t["lr_schedule"]
    return train_reference(
        GPT,
        global_batch=t["global_batch"],
        optimizer=t["optimizer"],
        lr=t["lr"],
        seed=SEED,
        steps=steps,
        dtype=dtype,
        weight_decay=t.get("weight_decay"),
        clip_grad_norm=t.get("clip_grad_norm"),
        lr_schedule=LrSchedule(t["lr"], schedule["warmup_steps"], schedule["decay_steps"], schedule["min_lr"]),
        history=history,
    )


def test_adamw_clipping_and_warmup_cosine_equal_one_process(tmp_path) -> None:
    steps = 5  # two warm-up steps (the first at rate 0), three of decay to the floor
    result, config = _launch(
        tmp_path, _plan(CUT_DIFFERENTLY), steps=steps, devices=5, save=tmp_path / "ckpt", optimizer="adamw", **TRAINING
    )
    history: list[dict] = []
    losses, blocks = _reference_of(config, steps, history=history)
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    _assert_params_equal(tmp_path / "ckpt", blocks)
    schedule = LrSchedule(1e-2, 2, 3, 1e-3)
    assert [h["lr"] for h in history] == [schedule.lr_at(s) for s in range(steps)]
    assert all(h["clipped"] for h in history)  # max_norm is small enough that every step clips
    for step, records in _by_step(result.records).items():
        assert len(records) == 5
        for r in records:  # every rank logs the same rate, norm and decision as the reference
            assert r["lr"] == history[step]["lr"]
            assert r["grad_norm"] == pytest.approx(history[step]["grad_norm"], rel=1e-5)
            assert r["clipped"] is True


def test_resuming_continues_the_schedule_and_the_clipping(tmp_path) -> None:
    first = _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    options = {"optimizer": "adamw", **TRAINING}
    _launch(tmp_path / "a", first, steps=2, devices=2, save=tmp_path / "ckpt", **options)
    resumed, config = _launch(
        tmp_path / "b", _plan(CUT_DIFFERENTLY), steps=2, devices=5, resume=tmp_path / "ckpt", **options
    )
    history: list[dict] = []
    losses, _ = _reference_of(config, 4, history=history)
    rank0 = [r for r in resumed.records if r["rank"] == 0]
    assert [r["step"] for r in rank0] == [2, 3]
    assert [r["loss"] for r in rank0] == pytest.approx(losses[2:], abs=1e-5)
    assert [r["lr"] for r in rank0] == [history[2]["lr"], history[3]["lr"]]  # not the warm-up again
    assert [r["grad_norm"] for r in rank0] == pytest.approx([h["grad_norm"] for h in history[2:]], rel=1e-5)


def test_fp16_clipping_unscales_first_and_matches_an_fp16_single_process_run(tmp_path) -> None:
    plan = _plan(
        [
            Pipeline(5, (2, 3), (_stage(0, 2, "n0/0", "n0/1", shares=(0.6, 0.4)), _stage(2, 6, "n0/2"))),
            Pipeline(3, (3,), (_stage(0, 6, "n0/3"),)),
        ],
        dtype="fp16",
    )
    steps = 3
    result, config = _launch(tmp_path, plan, steps=steps, optimizer="adamw", **TRAINING)
    history: list[dict] = []
    losses, _ = _reference_of(config, steps, dtype="fp16", history=history)
    rank0 = [r for r in result.records if r["rank"] == 0]
    assert [r["loss"] for r in rank0] == pytest.approx(losses, abs=1e-3)
    # the norm of the unscaled gradient (the loss scale is 2^16): what one fp16 process measures
    assert [r["grad_norm"] for r in rank0] == pytest.approx([h["grad_norm"] for h in history], rel=1e-3)
    assert all(r["clipped"] and r["skipped_step"] is False for r in rank0)
    assert all(h["grad_norm"] < 100 for h in history)


# -- a user's own spec (int64 ids, its loss, a layer two stages share) and a ResNet on user images ------
IMAGE_MODULE = """
import torch
from torch.utils.data import Dataset


class Images(Dataset):
    def __init__(self, size, side, classes):
        self.size, self.side, self.classes = size, side, classes

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        image = torch.randn(3, self.side, self.side, generator=g)
        return image, int(image.mean() > 0) + 2 * int(image[0].mean() > 0)


def build(size=16, side=64, classes=4):
    return Images(size, side, classes)
"""


def _launch_model(folder: Path, model: dict, pipelines: list[Pipeline], devices: int, *, steps: int, **kw):
    """Run ``model`` under the plan of ``pipelines`` (SGD) here; the rank config's kw as build_rank_config's."""
    profile = _profile(model)
    plan = _plan(pipelines)
    config = build_rank_config(
        plan, profile, make_cluster([("n0", [("cpu", devices)])]), seed=SEED, backend="gloo", timeout_s=60, **kw
    )
    write_yaml(config, folder / "rank-config.yaml")
    return launch_local(folder / "rank-config.yaml", steps=steps, save=folder / "ckpt"), config


def _sgd_loop(blocks, batches, loss, lr: float, steps: int) -> list[float]:
    """Plain PyTorch: the blocks as one nn.Sequential, torch's SGD (a shared parameter once),
    ``batches(step)`` -> a list of (inputs, targets) shares whose summed losses make the step's."""
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        total = sum(loss(model(x), y) for x, y in batches(step))
        total.backward()
        optimizer.step()
        losses.append(float(total.detach()))
    return losses


@pytest.fixture
def user_models_path(monkeypatch) -> None:
    """tests/models (user_models.py) importable here and by the ranks."""
    models = str(Path(__file__).resolve().parents[1] / "models")
    monkeypatch.syspath_prepend(models)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [models, os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("two_by_two", [False, True], ids=["2stages", "2x2"])
@pytest.mark.usefixtures("user_models_path")
def test_a_layer_shared_between_stages_equals_one_process(tmp_path, two_by_two: bool) -> None:
    # blocks embed, first, middle, again, out: 'first' and 'again' share one Linear, on two stages
    model = {"factory": "user_models:shared_tokens", "config": {}}
    zoo = resolve_model(model)
    assert zoo.tied_parameters()
    if two_by_two:
        pipelines = [
            Pipeline(3, (1, 2), (_stage(0, 3, "n0/0"), _stage(3, 5, "n0/1"))),
            Pipeline(3, (3,), (_stage(0, 2, "n0/2"), _stage(2, 5, "n0/3"))),
        ]
    else:
        pipelines = [Pipeline(6, (2, 4), (_stage(0, 3, "n0/0"), _stage(3, 5, "n0/1")))]
    steps = 3
    result, config = _launch_model(tmp_path, model, pipelines, 4 if two_by_two else 2, steps=steps)
    blocks = zoo.build_blocks(0, zoo.n_blocks, SEED)
    assert blocks[1][0] is blocks[3][0]  # one Linear in the single-process model
    lr = config["training"]["lr"]

    def whole(step: int):
        x, y = zoo.sample_batch(6, seed=SEED, step=step)
        return [(x, y)]

    def user_loss(y, t):  # the spec's own mean loss, on the whole batch
        return torch.nn.functional.cross_entropy(y.flatten(0, 1), t.flatten())

    losses = _sgd_loop(blocks, whole, user_loss, lr, steps)
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    _assert_params_equal(tmp_path / "ckpt", blocks)


@pytest.mark.parametrize("two_by_two", [False, True], ids=["2stages", "2x2"])
def test_a_resnet_trains_on_a_user_image_dataset_as_one_process(tmp_path, monkeypatch, two_by_two: bool) -> None:
    name = f"user_images_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(IMAGE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    model = {"family": "resnet", "config": {"depth": 18, "image_size": 64, "classes": 4}}
    zoo = resolve_model(model)
    n = zoo.n_blocks
    # 64 x 64 images: layer4 keeps a 2 x 2 map, so BatchNorm has statistics at a batch of one.
    # BatchNorm normalises over the batch it sees: one micro-batch per pipeline, and the reference
    # runs each pipeline's share as its own forward (as data parallelism without SyncBatchNorm does)
    if two_by_two:
        pipelines = [
            Pipeline(4, (4,), (_stage(0, 4, "n0/0"), _stage(4, n, "n0/1"))),
            Pipeline(4, (4,), (_stage(0, 6, "n0/2"), _stage(6, n, "n0/3"))),
        ]
        shares = [(0, 4), (4, 8)]
    else:
        pipelines = [Pipeline(8, (8,), (_stage(0, 5, "n0/0"), _stage(5, n, "n0/1")))]
        shares = [(0, 8)]
    steps = 2
    spec = f"{name}:build"
    result, config = _launch_model(
        tmp_path, model, pipelines, 4 if two_by_two else 2, steps=steps, dataset=spec, dataset_kwargs={"size": 16}
    )
    data = UserDataset(spec, {"size": 16}, zoo=zoo, global_batch=8, seed=SEED)
    blocks = zoo.build_blocks(0, n, SEED)

    def shares_of(step: int):
        return [data.read(step, lo, hi) for lo, hi in shares]

    def loss(y, t):  # a SUM over the share, over the global batch: the shares add up to the mean
        return torch.nn.functional.cross_entropy(y, t, reduction="sum") / 8

    losses = _sgd_loop(blocks, shares_of, loss, config["training"]["lr"], steps)
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    for i, block in enumerate(blocks):
        saved = read_block(tmp_path / "ckpt", i).params
        for key, value in block.named_parameters():  # parameters: each replica keeps its own BN statistics
            torch.testing.assert_close(saved[key], value.detach(), atol=1e-5, rtol=0)


@pytest.mark.usefixtures("user_models_path")
def test_a_plain_resnet_module_splits_and_trains_as_the_unsplit_model(tmp_path, monkeypatch) -> None:
    """torchvision's ResNet layout (tests/models/tv_like.py), returned whole by its factory: split at
    its chain (stem, each BasicBlock, head), two stages, a user image dataset; against plain PyTorch
    on the unsplit module: losses and weights within 1e-5, and the consolidated checkpoint is the
    module's own state_dict (BatchNorm statistics too: one micro-batch, the whole batch, as one process)."""
    import tv_like

    from hetplan.models import derive_seed
    from hetplan.runtime.weights.consolidate import consolidated_state

    name = f"user_images_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(IMAGE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    model = {"factory": "tv_like:resnet18", "config": {"num_classes": 4}, "input_shape": [3, 64, 64]}
    zoo = resolve_model(model)
    assert zoo.block_names()[0] == "conv1" and zoo.block_names()[-1] == "fc"
    n = zoo.n_blocks
    pipelines = [Pipeline(8, (8,), (_stage(0, 4, "n0/0"), _stage(4, n, "n0/1")))]
    steps = 2
    spec = f"{name}:build"
    result, config = _launch_model(
        tmp_path, model, pipelines, 2, steps=steps, dataset=spec, dataset_kwargs={"size": 16}
    )
    with torch.random.fork_rng(devices=[]):  # the factory's own call, as hetplan makes it
        torch.manual_seed(derive_seed("factory", SEED))
        plain = tv_like.resnet18(num_classes=4)
    data = UserDataset(spec, {"size": 16}, zoo=zoo, global_batch=8, seed=SEED)
    optimizer = torch.optim.SGD(plain.parameters(), lr=config["training"]["lr"])
    losses = []
    for step in range(steps):
        x, y = data.read(step, 0, 8)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(plain(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    state, _, _ = consolidated_state(tmp_path / "ckpt")
    assert set(state) == set(plain.state_dict())
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[key], value, atol=1e-5, rtol=0, msg=key)
