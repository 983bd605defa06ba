"""``gears-ddp process`` as a user runs it: stopped by a signal while it writes, it leaves no
temporary file and exits with one line; run again on the same name, it says how to load or
replace the dataset from the command line too; a dataset name that would write outside the
data folder is refused."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import toy_data
from test_bad_input import _refused_in_one_line
from test_screen_check import _counts, _files_and_folders, _other_screens_folder, _own_column, _toy_process_argv

from gears_ddp.cli import main
from gears_ddp.data import io, stop_signals
from gears_ddp.data.go_files import write_go_files
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED

# gears-ddp process with each block of cells written slowly (16 blocks of the toy screen, a
# second each), so that a signal sent once its temporary files appear lands while they are
# written, however busy the machine (the signal cuts the sleep short)
SLOW_PROCESS = """
import sys, time
from gears_ddp.cli import main
from gears_ddp.data import io, normalization

normalization.COUNTS_PER_BLOCK = 21 * 40
append = io.CsrRows.append


def slow_append(self, block):
    time.sleep(1.0)
    append(self, block)


io.CsrRows.append = slow_append
sys.exit(main(["process", *sys.argv[1:]]))
"""


def _temporaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.tmp"))


def _process_argv(tmp_path: Path, data: Path) -> list[str]:
    """The options of ``gears-ddp process`` for the toy screen as it comes (raw counts, its
    own column) with GO files built from gene sets, written as dataset ``new`` into ``data``."""
    screen = tmp_path / "screen.h5ad"
    _own_column(_counts(toy_data.make_raw())).write_h5ad(screen)
    return _toy_process_argv(screen, data, tmp_path)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_process_stopped_while_it_writes_leaves_the_data_folder_as_it_was(stop, tmp_path):
    data = _other_screens_folder(tmp_path / "data")
    before = _files_and_folders(data)
    argv = _process_argv(tmp_path, data)
    running = subprocess.Popen(
        [sys.executable, "-c", SLOW_PROCESS, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (data / "new").is_dir() or not _temporaries(data / "new"):  # the processed file is being written
        assert running.poll() is None and time.monotonic() < deadline, running.communicate()
        time.sleep(0.02)
    assert _temporaries(data) and (data / "new").is_dir()  # the GO files' and the processed file's
    running.send_signal(stop)
    _, err = running.communicate(timeout=120)
    assert running.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"gears-ddp process: stopped by {stop.name} before {data / 'new' / io.PROCESSED_FILE} and the GO files "
        "had been written: none is left; run the same command again"
    )
    assert not _temporaries(data)
    assert _files_and_folders(data) == before  # no new folder, the other screen's GO files and dataset as they were


def test_a_stop_during_the_renames_of_files_that_belong_together_waits_for_all_of_them(tmp_path, monkeypatch):
    dests = [tmp_path / "a.txt", tmp_path / "sub" / "b.txt", tmp_path / "c.txt"]
    for dest in dests:
        dest.parent.mkdir(exist_ok=True)
        dest.write_text("old")
    replace = os.replace

    def stopped_at_the_first(source, target):  # the signal comes as the first file is renamed
        if Path(target) == dests[0]:
            os.kill(os.getpid(), signal.SIGTERM)
        replace(source, target)

    monkeypatch.setattr(os, "replace", stopped_at_the_first)
    with pytest.raises(stop_signals.Stopped, match="stopped by SIGTERM"), stop_signals.stops_raised((signal.SIGTERM,)):
        with io.atomic_files(dests) as paths:
            for path in paths:
                path.write_text("new")
    assert [dest.read_text() for dest in dests] == ["new"] * 3
    assert not _temporaries(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is not stop_signals._raise_stop  # the handlers put back


def test_a_process_stopped_as_its_files_are_renamed_ends_with_them_all_written(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    argv = _process_argv(tmp_path, data)
    target = data / "new" / io.PROCESSED_FILE
    replace = os.replace

    def stopped_at_the_processed_file(source, dest):
        if Path(dest) == target:
            os.kill(os.getpid(), signal.SIGINT)
        replace(source, dest)

    monkeypatch.setattr(os, "replace", stopped_at_the_processed_file)
    assert main(["process", *argv]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gears-ddp process: stopped by SIGINT after {target} and the GO files had been written whole"
    )
    assert target.is_file() and (data / "go_essential_all" / "go_essential_all.csv").is_file()
    assert not _temporaries(data)


def test_processing_a_name_again_says_how_to_load_or_replace_it_on_the_command_line(tmp_path, capsys):
    data = tmp_path / "data"
    argv = ["process", *_process_argv(tmp_path, data)]
    assert main(argv) == 0
    _refused_in_one_line(
        capsys,
        argv,
        f"{data / 'new' / io.PROCESSED_FILE} already exists",
        f"gears-ddp train --set pert_data_path={data} --set dataset_name=new",
        "(overwrite=True; gears-ddp process --overwrite)",
    )
    assert main([*argv, "--overwrite"]) == 0


def test_go_files_of_another_annotation_are_refused_naming_the_command_line_too(tmp_path):
    write_go_files(tmp_path, {"GENE": {"GO:0000001"}})
    with pytest.raises(FileExistsError, match="gears-ddp demo --data-path.*gears-ddp process --go-annotation"):
        write_go_files(tmp_path, {"GENE": {"GO:0000002"}})


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", ".", "", "a\\b"])
def test_a_dataset_name_that_is_no_plain_folder_name_is_refused(name, tmp_path, capsys):
    data = tmp_path / "data"
    argv = _process_argv(tmp_path, data)
    argv[argv.index("--name") + 1] = name
    _refused_in_one_line(capsys, ["process", *argv], f"dataset name {name!r} is not a plain folder name")
    assert not data.exists() and sorted(path.name for path in tmp_path.iterdir()) == ["go.gmt", "screen.h5ad"]


def test_a_stop_whose_exception_was_dropped_still_stops_at_the_next_held_step_or_the_blocks_end():
    def dropped_stop():  # as Python drops a handler's exception raised in a weak reference's callback
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except stop_signals.Stopped:
            pass

    steps = []
    with pytest.raises(stop_signals.Stopped, match="stopped by SIGTERM"):
        with stop_signals.stops_raised((signal.SIGTERM,)):
            dropped_stop()
            with stop_signals.stops_held():
                steps.append("held step, run whole")
            steps.append("after it")
    assert steps == ["held step, run whole"]
    with pytest.raises(stop_signals.Stopped, match="stopped by SIGTERM"):
        with stop_signals.stops_raised((signal.SIGTERM,)):
            dropped_stop()
            steps.append("to the end of the block")
    assert steps[-1] == "to the end of the block"
    with stop_signals.stops_raised((signal.SIGTERM,)):  # each stop said once: none is left over
        steps.append("a block of its own")
