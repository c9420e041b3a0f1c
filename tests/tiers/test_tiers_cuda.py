"""The CUDA paths of PagedKVView and CPURegion (skipped without a CUDA device)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiers_testlib import make_caches, reference_gather

from tiers.cpu import CPURegion
from tiers.paged import PagedKVView

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NUM_BLOCKS = 13


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """Regions live in /dev/shm (kvstore's default `region_dir`). On the H200 this ran on, the
    CUDA runtime pinned a shared mapping of a /dev/shm file but refused one of a /tmp file."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvstore-test-") as folder:
        yield Path(folder)


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "unpinned"])
@pytest.mark.parametrize("layout", ["kv_split", "kv_split_shared", "cross_layer", "cpu_backend"])
def test_gather_and_scatter_on_cuda_through_a_region(shm_dir: Path, layout: str, pin: bool) -> None:
    host = make_caches(layout, 3, NUM_BLOCKS, torch.bfloat16, seed=11)
    device = {name: tensor.cuda() for name, tensor in host.items()}
    view = PagedKVView(device, NUM_BLOCKS)
    ids = [7, 2, 3, 4, 7, 12]
    size = view.buffer_bytes(len(ids))
    stream = torch.cuda.Stream()
    with CPURegion.create("cuda-region", 2, size, directory=shm_dir, pin=pin) as region:
        assert region.is_pinned is pin
        view.gather(ids, region.row_tensor(0), stream=stream)
        stream.synchronize()
        assert torch.equal(region.row_tensor(0), reference_gather(host, NUM_BLOCKS, ids))

        restored = {name: torch.zeros_like(tensor) for name, tensor in device.items()}
        PagedKVView(restored, NUM_BLOCKS).scatter(ids, region.row_tensor(0), stream=stream)
        stream.synchronize()
        unique = sorted(set(ids))
        back = {name: tensor.cpu() for name, tensor in restored.items()}
        assert torch.equal(
            reference_gather(back, NUM_BLOCKS, unique), reference_gather(host, NUM_BLOCKS, unique)
        )


def test_partial_chunk_on_cuda(tmp_path: Path) -> None:
    host = make_caches("kv_split", 2, NUM_BLOCKS, torch.float16, seed=12)
    view = PagedKVView({name: t.cuda() for name, t in host.items()}, NUM_BLOCKS)
    full = torch.zeros(view.buffer_bytes(4), dtype=torch.uint8).pin_memory()
    view.gather([5, 6], full, first_block=2)
    torch.cuda.synchronize()
    expected = torch.zeros_like(full)
    PagedKVView(host, NUM_BLOCKS).gather([5, 6], expected, first_block=2)
    assert torch.equal(full, expected)


def test_a_refused_registration_leaves_no_error_for_the_next_kernel() -> None:
    """A failed cudaHostRegister sets the runtime's last error; left there, torch's next kernel
    launch check reported it as its own ("invalid argument" from an index_select)."""
    from tiers import _cuda
    from tiers.errors import RegionError

    with pytest.raises(RegionError):
        _cuda.host_register(1, 4096)  # not a host allocation: refused on any machine
    x = torch.arange(12, device="cuda").reshape(3, 4)
    picked = torch.index_select(x, 0, torch.tensor([2, 0], device="cuda"))
    torch.cuda.synchronize()
    assert picked.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
