"""The bundled device catalog and example clusters: present, loadable, plausible, cited."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from hetplan.contracts import load_catalog, load_cluster
from hetplan.contracts.paths import bundled_profiles_dir

PROFILES = bundled_profiles_dir()
CATALOG_FILE = PROFILES / "devices.yaml"
CLUSTERS = PROFILES / "clusters"

REQUIRED_TYPES = [
    "H100-SXM",
    "A100-80GB",
    "A100-40GB",
    "V100-32GB",
    "V100-16GB",
    "A10",
    "L4",
    "T4",
    "RTX-4090",
    "RTX-3090",
    "RTX-2080Ti",
    "RTX-2080",
    "TITAN-RTX",
    "P100",
    "GH200",
    "cpu",
]

# Names other tools use (Sailor's profiles among them) that importers map through aliases.
ALIASES = {
    "A100-40": "A100-40GB",
    "A100-80": "A100-80GB",
    "V100-16": "V100-16GB",
    "V100-32": "V100-32GB",
    "Titan-RTX": "TITAN-RTX",
    "GH-96": "GH200",
    "RTX-2080": "RTX-2080",
    "RTX-3090": "RTX-3090",
}

# file -> (device count per type, number of nodes)
EXPECTED_CLUSTERS = {
    "local-4.yaml": ({"cpu-fast": 2, "cpu-slow": 2}, 1),
    "mixed-a100-v100.yaml": ({"A100-80GB": 16, "V100-16GB": 16}, 4),
    "v100-t4.yaml": ({"V100-16GB": 12, "T4": 4}, 4),
    "rtx-mix.yaml": ({"TITAN-RTX": 8, "RTX-2080": 8, "RTX-3090": 8}, 3),
    "scale-a100-v100.yaml": ({"A100-40GB": 128, "V100-16GB": 384}, 64),
    "mixed-small.yaml": ({"A100-80GB": 2, "V100-16GB": 2, "T4": 2}, 2),
}

GiB = 2.0**30


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


# -- the catalog ---------------------------------------------------------------


@pytest.mark.parametrize("name", REQUIRED_TYPES)
def test_required_type_present_and_positive(catalog, name):
    assert name in catalog.types, f"{name} missing from {CATALOG_FILE}"
    device = catalog.get(name)
    assert device.memory > 0
    assert device.memory_bandwidth > 0
    assert device.peak_flops("fp32") > 0
    assert not device.emulated


@pytest.mark.parametrize(("alias", "name"), sorted(ALIASES.items()))
def test_alias_resolves(catalog, alias, name):
    assert catalog.get(alias).name == name


def test_peaks_are_ordered_by_generation(catalog):
    h100 = catalog.get("H100-SXM").peak_flops("bf16")
    a100 = catalog.get("A100-80GB").peak_flops("bf16")
    v100 = catalog.get("V100-16GB").peak_flops("fp16")
    assert h100 > a100 > v100
    # dense, not with-sparsity figures
    assert a100 == pytest.approx(312e12)
    assert h100 < 1.2e15
    # tensor-core rates beat plain fp32 on every tensor-core GPU (GeForce Ampere/Ada by ~2x only)
    for name in ("H100-SXM", "A100-80GB", "V100-16GB", "T4", "TITAN-RTX", "RTX-2080Ti"):
        device = catalog.get(name)
        assert device.peak_flops("fp16") > 3 * device.peak_flops("fp32"), name
    for name in ("RTX-3090", "RTX-4090"):
        device = catalog.get(name)
        assert device.peak_flops("fp16") > 1.5 * device.peak_flops("fp32"), name


def test_known_memories(catalog):
    assert catalog.get("T4").memory == 16 * GiB
    assert catalog.get("A100-40GB").memory == 40 * GiB
    assert catalog.get("A100-80GB").memory == 80 * GiB
    assert catalog.get("GH200").memory == 96 * GiB
    assert catalog.get("RTX-2080").memory == 8 * GiB
    assert catalog.get("A100-80GB").memory_bandwidth > catalog.get("A100-40GB").memory_bandwidth
    assert catalog.get("GH200").memory_bandwidth > catalog.get("H100-SXM").memory_bandwidth


def test_pre_ampere_types_fall_back_to_fp32(catalog):
    v100 = catalog.get("V100-16GB")
    assert v100.peak_flops("bf16") == v100.peak_flops("fp32")
    assert v100.peak_flops("tf32") == v100.peak_flops("fp32")


def test_consumer_cards_use_fp32_accumulate_rate(catalog):
    # GeForce cards run FP16 tensor math with FP32 accumulate at half the FP16-accumulate rate:
    # RTX 3090 is 71 (not 142), RTX 4090 165.2 (not 330.3) TFLOP/s.
    assert catalog.get("RTX-3090").peak_flops("fp16") == pytest.approx(71e12)
    assert catalog.get("RTX-4090").peak_flops("fp16") == pytest.approx(165.2e12)


def _entry_blocks(text: str) -> dict[str, list[str]]:
    """The lines of each ``  NAME:`` entry under ``devices:`` in the raw catalog text."""
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        match = re.match(r"^  ([^\s#][^:]*):\s*$", line)
        if match:
            current = match.group(1)
            blocks[current] = []
        elif current is not None and (line.startswith("    ") or not line.strip()):
            blocks[current].append(line)
        else:
            current = None
    return blocks


def test_every_entry_cites_a_source(catalog):
    blocks = _entry_blocks(CATALOG_FILE.read_text(encoding="utf-8"))
    assert set(blocks) == set(catalog.types)
    for name, lines in blocks.items():
        comments = [line.strip() for line in lines if line.strip().startswith("#")]
        assert comments, f"{name}: no comment citing a source"
        text = " ".join(comments).lower()
        if name != "cpu":
            assert re.search(r"datasheet|whitepaper|specifications", text), f"{name}: no source named"


# -- the clusters ------------------------------------------------------------------


def test_every_expected_cluster_file_exists():
    present = {p.name for p in CLUSTERS.glob("*.yaml")}
    assert set(EXPECTED_CLUSTERS) <= present


@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*.yaml")), ids=lambda p: p.name)
def test_cluster_loads(path: Path):
    cluster = load_cluster(path)
    assert cluster.devices
    assert cluster.description.strip(), f"{path.name}: no description"
    if path.name in EXPECTED_CLUSTERS:
        counts, nodes = EXPECTED_CLUSTERS[path.name]
        assert dict(Counter(d.type.name for d in cluster.devices)) == counts
        assert len(cluster.nodes) == nodes


def test_scale_cluster_sizes():
    cluster = load_cluster(CLUSTERS / "scale-a100-v100.yaml")
    assert len(cluster.devices) == 512
    assert sum(d.type.name == "A100-40GB" for d in cluster.devices) == 128
    assert all(len(n.devices) == 8 for n in cluster.nodes)
    # racks: faster among A100 nodes of one rack, default elsewhere
    assert cluster.link("node0/0", "node7/0").bandwidth == pytest.approx(25e9)
    assert cluster.link("node0/0", "node8/0").bandwidth == pytest.approx(12.5e9)
    assert cluster.link("node0/0", "node16/0").bandwidth == pytest.approx(12.5e9)
    assert cluster.link("node20/0", "node21/0").bandwidth == pytest.approx(12.5e9)
    assert len(cluster.groups) == 2


def test_local_cluster_is_emulated():
    cluster = load_cluster(CLUSTERS / "local-4.yaml")
    assert [n.name for n in cluster.nodes] == ["local"]
    assert cluster.emulated
    assert all(t.emulated and t.emulates == "cpu" for t in cluster.device_types.values())
    slow = cluster.device_types["cpu-slow"]
    fast = cluster.device_types["cpu-fast"]
    assert slow.peak_flops("fp32") == pytest.approx(fast.peak_flops("fp32") / 2)
    assert slow.memory == 4 * GiB
    assert "emulated" in cluster.description.lower()


def test_mixed_a100_v100_links():
    cluster = load_cluster(CLUSTERS / "mixed-a100-v100.yaml")
    between = cluster.link("node0/0", "node2/0")
    assert between.bandwidth == pytest.approx(12.5e9)
    assert between.latency == pytest.approx(10e-6)
    assert between.shared
    inside = cluster.link("node0/0", "node0/1")
    assert inside.bandwidth == pytest.approx(600e9)
    assert not inside.shared
    assert cluster.link("node2/0", "node2/7").bandwidth == pytest.approx(300e9)


def test_bundled_clusters_use_catalog_types(catalog):
    # Only the local-* clusters (single-machine runs) define their own (emulated) types.
    for path in sorted(CLUSTERS.glob("*.yaml")):
        if path.name.startswith("local-"):
            assert load_cluster(path).emulated, f"{path.name}: a local cluster must be labelled emulated"
            continue
        cluster = load_cluster(path)
        for name in cluster.device_types:
            assert name in catalog.types, f"{path.name}: {name} is not a catalog type"
