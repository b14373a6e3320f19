"""One SKU table: every SKU the product names, estimates marked with their source."""

from __future__ import annotations

import pytest

from hbmwatch.skus import SKUS, Vendor, lookup, render_markdown
from tests.conftest import REPO


@pytest.mark.parametrize(
    "name",
    [
        "MI300X",
        "MI325X",
        "MI350X",
        "MI355X",
        "MI400X",
        "MI430X",
        "MI440X",
        "MI455X",
        "H100",
        "H200",
    ],
)
def test_every_sku_is_present_and_sane(name: str) -> None:
    sku = SKUS[name]
    assert sku.hbm_stacks > 0 and sku.memory_bytes > 0
    assert sku.memory_slowdown_c < sku.memory_shutdown_c
    assert sku.hotspot_slowdown_c < sku.hotspot_shutdown_c
    assert sku.source


def test_domain_facts() -> None:
    assert SKUS["MI300X"].hbm_stacks == 8 and SKUS["MI300X"].memory_bytes == 192 * 10**9
    assert SKUS["H100"].hbm_stacks == 5 and SKUS["H200"].hbm_stacks == 6
    assert SKUS["MI355X"].board_power_watts == 1400 and SKUS["MI355X"].cooling == "dlc"
    assert SKUS["MI400X"].fabric == "ualink"
    assert SKUS["H200"].vendor is Vendor.NVIDIA


def test_mi400_series_are_marked_estimates_with_a_source() -> None:
    for name in ("MI400X", "MI430X", "MI440X", "MI455X"):
        assert SKUS[name].estimate
        assert "estimat" in SKUS[name].source


def test_lookup_vendor_spellings() -> None:
    assert lookup("NVIDIA H200").name == "H200"
    assert lookup("AMD Instinct MI300X").name == "MI300X"
    assert lookup("unknown") is None


def test_docs_skus_md_is_generated_from_the_table() -> None:
    assert (REPO / "docs" / "skus.md").read_text() == render_markdown(), "run: hbmwatch docs skus"
