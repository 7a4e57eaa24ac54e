import pytest

from qproxy_tools.cluster.host import is_mountpoint, mounts, mounts_below, pids_in_netns


def mountinfo_points():
    """The mount points /proc/self/mountinfo lists, read here on their own."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f]


def test_mounts_lists_proc():
    assert "/proc" in mounts()


def test_mounts_are_mountinfo_in_its_order():
    points = mountinfo_points()
    if any("\\" in p for p in points):
        pytest.skip("a mount point here has an escaped character")
    assert mounts() == points


def test_proc_is_a_mount_point():
    assert is_mountpoint("/proc")


def test_a_trailing_slash_is_the_same_mount_point():
    assert is_mountpoint("/proc/")


def test_a_fresh_folder_is_not_a_mount_point(tmp_path):
    folder = tmp_path / "fresh"
    folder.mkdir()
    assert not is_mountpoint(str(folder))


def test_a_missing_path_is_not_a_mount_point(tmp_path):
    assert not is_mountpoint(str(tmp_path / "missing"))


def test_mounts_below_a_mount_point_starts_with_it():
    below = mounts_below("/proc")
    assert below[0] == "/proc"
    assert all(m == "/proc" or m.startswith("/proc/") for m in below)


def test_mounts_below_includes_nested_mounts():
    nested = [m for m in mounts() if m.startswith("/sys/")]
    if not nested:
        pytest.skip("no mount below /sys on this machine")
    assert set(nested) <= set(mounts_below("/sys"))
    assert set(nested) <= set(mounts_below("/sys/"))


def test_mounts_below_a_prefix_of_a_name_is_not_that_mount():
    # /de is a prefix of /dev's name, not a folder above it.
    assert "/dev" not in mounts_below("/de")
    assert not any(m.startswith("/dev") for m in mounts_below("/de"))


def test_nothing_is_mounted_below_a_fresh_folder(tmp_path):
    assert mounts_below(str(tmp_path)) == []


def test_no_process_is_in_a_netns_path_that_is_not_a_mount_point(tmp_path):
    path = tmp_path / "netns"
    path.write_text("")
    assert pids_in_netns(str(path)) == []
    assert pids_in_netns(str(tmp_path / "missing")) == []


def test_the_root_is_a_mount_point():
    assert "/" in mounts()
    assert is_mountpoint("/")
