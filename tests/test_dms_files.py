"""Files written whole (pipelines.dms.files): the new file replaces the old one by a rename,
readable by all, and a write that fails leaves the old file and nothing beside it."""

import stat

import pytest

from pipelines.dms.files import replace_whole


def test_the_new_file_replaces_the_old_one_readable_by_all(tmp_path):
    path = tmp_path / "document.json"
    path.write_text("old")
    seen = []

    def write(target):
        seen.append((target.parent, target.name != path.name, path.read_text()))
        target.write_text("new")

    assert replace_whole(path, write) == path
    assert seen == [(tmp_path, True, "old")]  # written beside it, the old file still whole
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["document.json"]


def test_a_write_that_fails_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = tmp_path / "table.parquet"
    path.write_text("old")

    def write(target):
        target.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_whole(path, write)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


def test_a_missing_folder_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        replace_whole(tmp_path / "absent" / "file", lambda target: target.write_text("x"))
