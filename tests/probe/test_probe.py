"""``hetplan probe``: the node entry it writes validates, devices keep PCI order, and figures more
than 20% from the catalog get a line (measured here on the CPU; GPUs through a stub torch)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetplan.cli import main
from hetplan.contracts import load_catalog, load_cluster
from hetplan.errors import HetplanError
from hetplan.probe import ProbeResult, probe_node
from hetplan.probe.entry import DeviceFigures
from hetplan.probe.seen import SeenDevice, pci_order_env, seen_devices
from hetplan.probe.timing import time_call

GiB = 2.0**30


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_probe_here_writes_a_cluster_entry_that_validates(tmp_path: Path, capsys) -> None:
    out, record = tmp_path / "node.yaml", tmp_path / "node.json"
    with pytest.raises(SystemExit) as done:
        main(["probe", "-o", str(out), "--name", "here", "--seconds", "0.05", "--json", str(record)])
    assert done.value.code == 0
    cluster = load_cluster(out)
    [node] = cluster.nodes
    assert node.name == "here" and len(node.devices) >= 1
    data = json.loads(record.read_text())
    device = data["devices"][0]
    assert device["matmul_tflops"]["fp32"] > 0 and device["memory_bandwidth"] > 0
    if device["kind"] == "cpu":  # no GPU here: the CPU, described by what was measured
        spec = cluster.device_types[device["entry_type"]]
        assert spec.peak_flops("fp32") == pytest.approx(device["matmul_tflops"]["fp32"] * 1e12, rel=1e-3)
        assert spec.backends == ("gloo",)
    text = out.read_text()
    assert "# Written by 'hetplan probe'" in text and "NOT measured" in text
    assert "wrote" in capsys.readouterr().out


def test_bad_options_end_in_one_line(tmp_path: Path, capsys) -> None:
    for args, field in ((["--network", "fast"], "--network"), (["--name", "a/b"], "--name")):
        with pytest.raises(SystemExit) as done:
            main(["probe", "-o", str(tmp_path / "x.yaml"), "--seconds", "0.01", *args])
        assert done.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {field}:") and "\n" not in err
    assert not (tmp_path / "x.yaml").exists()


def _gpu(index: int, name: str, memory_gib: float, bus: int, catalog) -> SeenDevice:
    from hetplan.profile.measure import cuda_device_type

    return SeenDevice(index=index, name=name, memory=memory_gib * GiB, pci_bus_id=f"0000:{bus:02x}:00.0",
                      type=cuda_device_type(name, memory_gib * GiB, catalog), sms=100)  # fmt: skip


def _result(catalog, devices, figures, links=None) -> ProbeResult:
    return ProbeResult(node="n0", devices=devices, figures=figures, catalog=catalog, links=links or {},
                       link_latency=5e-6, host={"hostname": "n0"})  # fmt: skip


def test_mixed_node_groups_types_in_pci_order_and_inlines_unknown_gpus(catalog, tmp_path: Path) -> None:
    devices = [
        _gpu(0, "NVIDIA H100 80GB HBM3", 79.6, 0x1B, catalog),
        _gpu(1, "NVIDIA H100 80GB HBM3", 79.6, 0x2C, catalog),
        _gpu(2, "NVIDIA H100 NVL", 93.0, 0x9D, catalog),  # not in the catalog: measured spec
    ]
    figures = [
        DeviceFigures({"bf16": 600.0, "fp32": 48.0}, memory_bandwidth=2.7e12, host_to_device=50e9),
        DeviceFigures({"bf16": 590.0, "fp32": 47.0}, memory_bandwidth=2.7e12, host_to_device=50e9),
        DeviceFigures({"bf16": 650.0, "fp32": 50.0}, memory_bandwidth=3.2e12, host_to_device=50e9),
    ]
    result = _result(catalog, devices, figures, links={"0->1": 300e9, "0->2": 250e9, "2->0": 260e9})
    mapping = result.cluster_mapping()
    entries = mapping["nodes"][0]["devices"]
    assert [(e["type"], e["count"]) for e in entries] == [("H100-SXM", 2), ("H100-NVL", 1)]
    assert entries[1]["spec"]["tflops"] == {"bf16": 650.0, "fp32": 50.0}
    assert mapping["nodes"][0]["link"]["bandwidth"] == "250.00GB/s"  # the slowest pair
    cluster = load_cluster(result.write(tmp_path / "n0.yaml"))
    assert [d.type.name for d in cluster.devices] == ["H100-SXM", "H100-SXM", "H100-NVL"]
    assert cluster.link("n0/0", "n0/2").bandwidth == pytest.approx(250e9)


def test_a_line_only_where_measured_and_catalog_differ_by_more_than_20_percent(catalog) -> None:
    h100 = catalog.get("H100-SXM")
    expected_bf16 = h100.peak_flops("bf16") / 1e12 * h100.efficiency.gemm_fraction("bf16")
    expected_fp32 = h100.peak_flops("fp32") / 1e12 * h100.efficiency.gemm_fraction("fp32")
    device = _gpu(0, "NVIDIA H100 80GB HBM3", 79.6, 0x1B, catalog)
    memory_bw = h100.memory_bandwidth * h100.efficiency.memory
    figures = DeviceFigures({"bf16": expected_bf16 * 0.5, "fp32": expected_fp32 * 1.1}, memory_bandwidth=memory_bw)
    lines = _result(catalog, [device], [figures]).differences
    assert len(lines) == 1, lines
    assert lines[0].startswith("n0/0 H100-SXM: bf16 matmul") and "50% below" in lines[0]
    # a GPU with the wrong memory for its name (or a wrong mapping) is named too
    small = SeenDevice(index=0, name="NVIDIA H100 80GB HBM3", memory=40 * GiB, pci_bus_id="", type="H100-SXM")
    figures = DeviceFigures({"bf16": expected_bf16}, memory_bandwidth=memory_bw)
    assert [line for line in _result(catalog, [small], [figures]).differences if ": memory 40 GiB" in line]


class _Props(SimpleNamespace):
    pass


def _stub_torch(props: list[_Props]):
    cuda = SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: len(props),
        get_device_properties=lambda i: props[i],
    )
    return SimpleNamespace(cuda=cuda)


def test_seen_devices_follow_pci_order_and_map_names(catalog, monkeypatch) -> None:
    props = [  # torch's own order: fastest first (CUDA's default), not bus order
        _Props(name="NVIDIA A100-SXM4-80GB", total_memory=79.2 * GiB, pci_bus_id=0x81, pci_domain_id=0,
               pci_device_id=0, multi_processor_count=108),
        _Props(name="Tesla V100-SXM2-16GB", total_memory=15.8 * GiB, pci_bus_id=0x1A, pci_domain_id=0,
               pci_device_id=0, multi_processor_count=80),
    ]  # fmt: skip
    seen = seen_devices(_stub_torch(props), catalog)
    assert [(d.index, d.type, d.pci_bus_id) for d in seen] == [
        (1, "V100-16GB", "0000:1a:00.0"),
        (0, "A100-80GB", "0000:81:00.0"),
    ]
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert pci_order_env() == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert pci_order_env() == "FASTEST_FIRST"  # a user's explicit choice is kept (and recorded)


def test_time_call_keeps_to_its_budget() -> None:
    import time

    calls = []
    began = time.perf_counter()
    seconds = time_call(lambda: calls.append(time.sleep(0.002)), sync=lambda: None, budget=0.05)
    assert 0.0015 < seconds < 0.02
    assert time.perf_counter() - began < 1.0


def test_probe_refuses_a_non_positive_time() -> None:
    with pytest.raises(HetplanError, match="positive"):
        probe_node(seconds=0)
