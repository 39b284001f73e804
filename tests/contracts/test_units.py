"""Unit strings people write in cluster files, parsed to base units (bytes, bytes/s, seconds)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.contracts.fields import Fields
from hetplan.errors import HetplanError
from hetplan.units import format_bandwidth, format_bytes, format_time, parse_bandwidth, parse_bytes, parse_time

GiB = 2.0**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("600GB/s", 600e9),
        ("100Gbps", 12.5e9),  # bits: divided by 8
        ("25Gbit/s", 3.125e9),
        ("10Gb/s", 1.25e9),
        ("15.75GB/s", 15.75e9),
        ("1GiB/s", GiB),
        ("5 GB/s", 5e9),
        ("  200Gbps ", 25e9),
        ("400MB/s", 400e6),
        ("1e3B/s", 1000.0),
    ],
)
def test_bandwidth(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("16GB", 16e9),
        ("16GiB", 17179869184.0),
        ("512MB", 512e6),
        ("4KiB", 4096.0),
        ("1TiB", 2.0**40),
        ("100B", 100.0),
        ("1.5GiB", 1.5 * GiB),
    ],
)
def test_bytes(text: str, expected: float) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5us", 5e-06),
        ("5µs", 5e-06),
        ("2ms", 0.002),
        ("1.5s", 1.5),
        ("100ns", 1e-07),
        ("10us", 1e-05),
        ("1min", 60.0),
        ("0us", 0.0),
    ],
)
def test_time(text: str, expected: float) -> None:
    # exact, not approximate: "5us" is the float 5e-06, the same as writing 5e-06 in the file
    assert parse_time(text) == expected


def test_five_microseconds_is_exact() -> None:
    assert parse_time("5us") == 5e-06
    assert repr(parse_time("5us")) == "5e-06"


@pytest.mark.parametrize("parse", [parse_bytes, parse_bandwidth, parse_time])
@pytest.mark.parametrize("number", [0, 1, 12.5e9, 5e-06, 80 * GiB, 7])
def test_plain_numbers_are_base_units(parse, number: float) -> None:
    assert parse(number) == float(number)
    assert isinstance(parse(number), float)


@pytest.mark.parametrize("parse", [parse_bytes, parse_bandwidth, parse_time])
@pytest.mark.parametrize("value", [True, False])
def test_bool_rejected(parse, value: bool) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse(value)


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (parse_bandwidth, "100Gbsp"),
        (parse_bandwidth, "600"),  # a string needs its unit
        (parse_bandwidth, "GB/s"),
        (parse_bandwidth, "fast"),
        (parse_bandwidth, ""),
        (parse_bandwidth, "12,5GB/s"),
        (parse_bandwidth, "100GB"),  # a size is not a rate
        (parse_bytes, "80GIB"),
        (parse_bytes, "80Gib"),
        (parse_bytes, "16GB/s"),
        (parse_bytes, "lots"),
        (parse_time, "5 sec"),
        (parse_time, "2mss"),
        (parse_time, "5"),
        (parse_bytes, None),
        (parse_bandwidth, [100]),
        (parse_time, {"us": 5}),
    ],
)
def test_garbage_rejected(parse, value: object) -> None:
    with pytest.raises(ValueError, match="expected") as exc:
        parse(value)
    assert repr(value) in str(exc.value)


def test_error_text_gives_an_example() -> None:
    with pytest.raises(ValueError, match=r"such as '600GB/s' or '100Gbps', got '100Gbsp'"):
        parse_bandwidth("100Gbsp")
    with pytest.raises(ValueError, match=r"such as '80GiB'"):
        parse_bytes("big")
    with pytest.raises(ValueError, match=r"such as '5us'"):
        parse_time("soon")


@pytest.mark.parametrize("parse", [parse_bytes, parse_bandwidth, parse_time])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400])
def test_non_finite_rejected(parse, value: object) -> None:
    with pytest.raises(ValueError, match="finite"):
        parse(value)


@pytest.mark.parametrize(("parse", "text"), [(parse_bytes, "1e999GB"), (parse_bandwidth, "1e308TB/s")])
def test_overflow_rejected(parse, text: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        parse(text)


def test_negative_strings_parse_and_fields_refuse_them() -> None:
    # the parser keeps the sign, so the loader can say precisely what is wrong
    assert parse_bandwidth("-5GB/s") == -5e9
    assert parse_time("-2ms") == -0.002
    f = Fields({"bw": "-5GB/s", "n": -100, "zero": 0, "lat": "-1us", "mem": "0GiB", "ok": "0us"}, file="c.yaml")
    with pytest.raises(HetplanError) as exc:
        f.bandwidth("bw")
    assert str(exc.value) == "c.yaml: bw: expected a positive value, got '-5GB/s'"
    with pytest.raises(HetplanError, match="positive"):
        f.bandwidth("n")
    with pytest.raises(HetplanError, match="positive"):
        f.bandwidth("zero")
    with pytest.raises(HetplanError, match="non-negative"):
        f.time("lat")
    with pytest.raises(HetplanError, match="positive"):
        f.bytes("mem")
    assert f.time("ok") == 0.0  # a zero latency is fine
    assert f.bytes("mem", positive=False) == 0.0


def test_fields_put_the_parse_error_in_place() -> None:
    f = Fields({"link": {"bandwidth": "100Gbsp"}}, file="c.yaml")
    with pytest.raises(HetplanError) as exc:
        f.child("link").bandwidth("bandwidth")
    assert str(exc.value).startswith("c.yaml: link.bandwidth: expected a bandwidth such as")


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10**6))
def test_integers_with_units_are_exact(n: int) -> None:
    assert parse_bytes(f"{n}GiB") == n * GiB
    assert parse_bytes(f"{n}MB") == n * 1e6
    assert parse_bandwidth(f"{n}Gbps") == n * 1e9 / 8
    assert parse_time(f"{n}us") == n / 1e6
    assert parse_time(f"{n}ms") == n / 1e3


def test_format() -> None:
    assert format_bytes(16 * GiB) == "16.0 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bandwidth(12.5e9) == "12.5 GB/s"
    assert format_bandwidth(400e6) == "400.0 MB/s"
    assert format_time(5e-06) == "5.0 us"
    assert format_time(0.002) == "2.00 ms"
    assert format_time(1.5) == "1.500 s"


def test_scientific_notation_in_a_file_is_a_number(tmp_path) -> None:
    """YAML 1.1 would read 8.6e9 and 1e-5 as strings; contract files read them as numbers."""
    from hetplan.contracts.yamlio import read_mapping

    path = tmp_path / "c.yaml"
    path.write_text("schema: x\nflops: 8.6e9\nlatency: 1e-5\nbw: 12.5e9\nquoted: '1e3'\nname: x1e3\n", encoding="utf-8")
    data = read_mapping(path)
    assert data["flops"] == 8.6e9
    assert data["latency"] == 1e-05
    assert parse_bandwidth(data["bw"]) == 12.5e9
    assert data["quoted"] == "1e3"  # quoted stays a string
    assert data["name"] == "x1e3"
