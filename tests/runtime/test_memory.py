import gc

import pytest
import torch

from hybridplan.runtime.memory import DeviceOutOfMemory, StorageTracker


def test_views_count_once_and_frees_are_seen():
    tr = StorageTracker()
    with tr:
        a = torch.empty(1000)  # 4000 bytes
        v = a[10:20].view(2, 5)
        b = torch.ones(250, dtype=torch.float64)  # 2000 bytes
        assert tr.current == 6000
        del a
        assert tr.current == 6000  # the view keeps the storage alive
        del v
        assert tr.current == 2000
        del b
    assert tr.current == 0 and tr.peak == 6000


def test_peak_window_and_categories():
    tr = StorageTracker()
    with tr:
        with tr.in_phase("activations"):
            x = torch.empty(100)
        tr.reset_peak()
        with tr.in_phase("backward"):
            y = torch.empty(50)
            del y
        assert tr.peak == 600 and tr.current == 400
        assert tr.peak_by_category["backward"] == 200 and tr.peak_by_category["activations"] == 400
        tr.retag(x, "gradients")
        assert tr.by_category["gradients"] == 400 and tr.by_category["activations"] == 0
        del x


def test_autograd_saved_tensors_are_counted_until_backward():
    tr = StorageTracker()
    w = torch.randn(64, 64, requires_grad=True)
    with tr:
        tr.track_all([w], "parameters")
        h = torch.randn(8, 64) @ w  # input (2 KiB) and product (2 KiB)
        out = torch.tanh(h)  # tanh saves its output
        saved = tr.current
        out.sum().backward()
        del h, out
    assert saved == 64 * 64 * 4 + 2 * 8 * 64 * 4 + 8 * 64 * 4
    assert tr.current == 2 * 64 * 64 * 4  # the weight and its gradient


def test_capacity_raises():
    tr = StorageTracker(capacity_bytes=1000)
    with pytest.raises(DeviceOutOfMemory, match="capacity 1000 bytes"):
        with tr:
            torch.empty(1000)


def test_forget_and_pause():
    tr = StorageTracker()
    with tr:
        with tr.paused():
            hidden = torch.empty(100)
        x = torch.empty(100)
        tr.forget(x)
        assert tr.current == 0 and not tr.counts(x)
        del hidden, x


def test_dtensor_counts_local_shard(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        tr = StorageTracker()
        with tr:
            local = torch.empty(10, 4)
            d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            p = torch.nn.Parameter(d)
            assert tr.current == 160
            tr.track_all([p], "parameters")
            assert tr.current == 160
            del local, d, p
            gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("watched", [False, True])
def test_a_storage_written_through_out_is_remeasured_after_an_outside_resize(watched, monkeypatch):
    """FSDP2 frees and re-allocates its all-gather buffers with ``storage.resize_`` (no op the tracker sees):
    a storage once written through ``out=`` is re-measured before the next op. Unwatched, before every op; watched
    ([Note: resizes outside ops] in runtime/resize_watch.py), after FSDP2's resizing functions ran, which resize
    the storage here as FSDP2 does."""
    import hybridplan.runtime.memory as memory
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    from hybridplan.runtime.resize_watch import watch_resizes

    if watched:
        assert watch_resizes()
        free, alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage
    else:
        monkeypatch.setattr(memory, "watching", lambda: False)
        free = lambda t: t.untyped_storage().resize_(0)  # noqa: E731
        alloc = lambda t: t.untyped_storage().resize_(t.numel() * t.itemsize)  # noqa: E731
    tr = StorageTracker()
    with tr:
        buf = torch.empty(256)  # 1 KiB
        src = torch.ones(256)  # 1 KiB
        torch.add(src, 1, out=buf)
        assert tr.current == 2048
        free(buf)  # freed outside any op
        one = torch.empty(1)  # the next op: 4 bytes, and the resize is seen
        assert tr.current == 1024 + 4
        alloc(buf)  # re-allocated outside any op
        two = torch.empty(2)
        assert tr.current == 2048 + 4 + 8 and tr.peak == 2048 + 4 + 8
        untouched = torch.empty(256)
        untouched.untyped_storage().resize_(0)  # never written through out=: not watched
        three = torch.empty(1)
        assert tr.current == 2048 + 4 + 8 + 1024 + 4
        del one, two, three