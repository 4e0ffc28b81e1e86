"""Fixtures for the power tests: synthetic hardware trees and a clock the test moves by hand."""

from __future__ import annotations

import pytest

from tests.support.sysfs import SyntheticMsr, SyntheticPowercap, SyntheticProc


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def powercap(tmp_path) -> SyntheticPowercap:
    return SyntheticPowercap(tmp_path / "powercap")


@pytest.fixture
def proc(tmp_path) -> SyntheticProc:
    return SyntheticProc(tmp_path / "proc")


@pytest.fixture
def msr(tmp_path) -> SyntheticMsr:
    return SyntheticMsr(tmp_path / "dev")


def intel_two_socket(pc: SyntheticPowercap, *, nested: bool = False, mmio: bool = True) -> None:
    """A two-socket Intel server as the kernel shows it: packages, their core/uncore/dram children, psys,
    and the MMIO interface repeating package-0."""
    pc.add("intel-rapl:0", "package-0")
    pc.add("intel-rapl:0:0", "core", nested=nested)
    pc.add("intel-rapl:0:1", "uncore", nested=nested)
    pc.add("intel-rapl:0:2", "dram", nested=nested)
    pc.add("intel-rapl:1", "package-1")
    pc.add("intel-rapl:1:0", "core", nested=nested)
    pc.add("intel-rapl:1:1", "dram", nested=nested)
    pc.add("intel-rapl:2", "psys")
    if mmio:
        pc.add("intel-rapl-mmio:0", "package-0")
