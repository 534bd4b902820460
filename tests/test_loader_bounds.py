"""Small hostile inputs are refused in one line with exit status 2, with nothing written to
--out and well under 1 GB of memory: the loaders' bounds (labels, decompression bombs, large
images, image_size), the config's (nesting, seeds, sweeps, planned trials), a full disk and a
refused store (the security probe of 2026-12-06: probes 5, 6, 7, 10, 19, 22 and 24).

The bombs run the command line in a fresh process, whose peak resident memory is its own
high-water mark (``VmHWM``) read while it runs: ``ru_maxrss`` from ``wait4`` would not do, since
Linux carries the forking parent's resident size across ``exec`` into it, and a test worker
that has run other tests holds gigabytes. Importing TensorFlow alone takes about 800 MB. Every
bad file is made here, small on disk however much it claims; nothing is downloaded.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import tomllib
from cli_capture import run_cli
from numpy.lib import format as npy
from PIL import Image

from leakbench.components import saved_models
from leakbench.core.errors import ConfigError, DataError
from leakbench.datasets import load_dataset
from leakbench.datasets._util import MAX_CLASSES
from leakbench.run import runner
from leakbench.run.config import (
    MAX_PLANNED_TRIALS,
    RECORD_PROTOCOL,
    load_config,
    parse_config,
)
from leakbench.run.grid import MAX_CONFIGURATIONS
from leakbench.run.kinds import MAX_SEEDS
from leakbench.run.store import Store

REPO = Path(__file__).resolve().parents[1]
# The bound every refusal of a bomb must stay under (bytes, as the brief states it).
MEMORY_LIMIT = 10**9
# A child still growing past this is killed, so that a regression cannot take the machine.
WATCHDOG_BYTES = 3 * 2**30
CHILD_SECONDS = 300
CLI = "import sys; from leakbench.cli import main; sys.exit(main(sys.argv[1:]))"
RESUME = "free space and rerun the same command to resume"

RUN = """\
name = "bounds"
dataset = "{dataset}"
model = "{model}"
suite = "listed"
images = 2
seeds = [0]
{extra}
[[attack]]
name = "idlg"
iterations = 5

[[defense]]
name = "none"

[training]
enabled = false
"""


def write_config(
    tmp: Path, dataset: str = "digits", model: str = "lenet", extra: str = "", name: str = "run"
) -> Path:
    """A tiny run's config (2 images, one idlg attack of 5 iterations, no training)."""
    path = tmp / f"{name}.toml"
    path.write_text(RUN.format(dataset=dataset, model=model, extra=extra), encoding="utf-8")
    return path


class Child(NamedTuple):
    code: int
    err: str
    peak_bytes: int


def run_child(tmp: Path, *argv: str) -> Child:
    """``leakbench ARGV...`` in a fresh process: its exit status, stderr and peak resident
    memory (its ``VmHWM`` after exec, the module docstring)."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    with (tmp / "child-stderr.txt").open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CLI, *argv],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        status, peak_kib = _wait_bounded(child.pid)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    text = (tmp / "child-stderr.txt").read_text(encoding="utf-8", errors="replace")
    return Child(child.returncode, text, peak_kib * 1024)


def _wait_bounded(pid: int) -> tuple[int, int]:
    """Waits for the child, killing it past `WATCHDOG_BYTES` or `CHILD_SECONDS`; its wait
    status and peak resident memory in KiB (the largest ``VmHWM`` read once it runs the
    command line: before its exec it is a copy of this process)."""
    deadline = time.monotonic() + CHILD_SECONDS
    peak_kib = 0
    while True:
        if _runs_the_cli(pid):
            peak_kib = max(peak_kib, _status_kib(pid, "VmHWM:"))
        done, status, _ = os.wait4(pid, os.WNOHANG)
        if done:
            assert peak_kib, "the child ended before its memory could be read"
            return status, peak_kib
        if _status_kib(pid, "VmRSS:") * 1024 > WATCHDOG_BYTES or time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _runs_the_cli(pid: int) -> bool:
    try:
        return CLI.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _status_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` field in KiB (0 once the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return 0
    line = next((x for x in status.splitlines() if x.startswith(field)), f"{field} 0 kB")
    return int(line.split()[1])


def assert_refused(child: Child, out: Path, *needles: str) -> None:
    """One ``leakbench: error:`` line holding every needle, exit 2, nothing in ``out``, and a
    peak under `MEMORY_LIMIT`."""
    lines = child.err.strip().splitlines()
    assert child.code == 2, child.err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("leakbench: error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists()
    assert child.peak_bytes < MEMORY_LIMIT, f"peak {child.peak_bytes / 1e6:.0f} MB"
    print(f"peak {child.peak_bytes / 1e6:.0f} MB: {lines[0][:120]}")


def assert_one_line(code: int, err: str, *needles: str) -> str:
    """Exit 2 and one ``leakbench: error:`` line holding every needle; the line."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("leakbench: error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- bomb files


def _alone(data: bytes) -> bytes:
    """``data`` as raw deflate blocks that refer to nothing before them (a full flush)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


def _deflated(prefix: bytes, zeros: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``prefix`` then ``zeros`` zero bytes, and its CRC-32. A block of
    zeros is compressed once and repeated, so gigabytes take a second to make."""
    block = 1 << 20
    count, rest = divmod(zeros, block)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # the final, empty block
    stream = _alone(prefix) + _alone(bytes(block)) * count + _alone(bytes(rest)) + end
    crc, chunk = zlib.crc32(prefix), bytes(block)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    return stream, zlib.crc32(bytes(rest), crc)


def write_zip(path: Path, members: dict[str, tuple[bytes, int]]) -> None:
    """A zip archive whose members (name -> (prefix, zero count)) are deflated; each member
    must inflate to less than 4 GiB (no zip64 records)."""
    central, offset = [], 0
    with path.open("wb") as out:
        for name, (prefix, zeros) in members.items():
            data, crc = _deflated(prefix, zeros)
            size, raw = len(prefix) + zeros, name.encode()
            fields = (crc, len(data), size, len(raw), 0)
            local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 33, *fields)
            out.write(local + raw + data)
            entry = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 33, *fields,
                                0, 0, 0, 0, offset)  # fmt: skip
            central.append(entry + raw)
            offset += len(local) + len(raw) + len(data)
        directory = b"".join(central)
        count = len(central)
        out.write(directory)
        out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory),
                              offset, 0))  # fmt: skip


def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The ``.npy`` header of an array of ``shape`` and ``dtype`` (its data follows it)."""
    stream = io.BytesIO()
    npy.write_array_header_1_0(stream, {"descr": dtype, "fortran_order": False, "shape": shape})
    return stream.getvalue()


def npz_bomb(path: Path) -> Path:
    """The probe's bomb: 100,000 x 64 x 64 x 3 zero pixels (1.2 GB, 4.9 GB as float32) in a
    file of about 1 MB."""
    shape = (100_000, 64, 64, 3)
    write_zip(path, {
        "x.npy": (npy_header(shape, "|u1"), int(np.prod(shape))),
        "y.npy": (npy_header((100_000,), "<i8"), 800_000),
    })  # fmt: skip
    return path


def gzip_member(data: bytes) -> bytes:
    return zlib.compress(data, 9, wbits=31)  # wbits 31: a gzip member


def idx_gzip_bomb(directory: Path, images: int, zeros: int) -> None:
    """t10k IDX files whose images file is a header claiming ``images`` 28 x 28 images, then
    ``zeros`` zero bytes as concatenated gzip members of 64 MiB each (about 64 KB on disk)."""
    directory.mkdir()
    block = 64 << 20
    member = gzip_member(bytes(block))
    head = gzip_member(b"\0\0\x08\x03" + struct.pack(">III", images, 28, 28))
    with (directory / "t10k-images-idx3-ubyte.gz").open("wb") as out:
        out.write(head)
        for _ in range(zeros // block):
            out.write(member)
    labels = b"\0\0\x08\x01" + struct.pack(">I", images)
    (directory / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip_member(labels))


# ----------------------------------------------------------------------------- labels


def test_a_label_of_10_to_the_12_is_refused_before_any_class_name_is_built(
    tmp_path: Path,
) -> None:
    y = np.arange(100) % 10
    y[3] = 10**12  # probe 5: 10**12 default class names
    np.savez(tmp_path / "big-label.npz", x=np.zeros((100, 8, 8), np.uint8), y=y)
    assert (tmp_path / "big-label.npz").stat().st_size < 10_000
    config = write_config(tmp_path, dataset="npz:big-label.npz")
    child = run_child(tmp_path, "run", str(config), "--out", "out", "--quiet")
    assert_refused(
        child, tmp_path / "out", "big-label.npz array 'y'", f"below {MAX_CLASSES}", str(10**12)
    )


def test_a_uint64_max_label_is_named_as_it_is_not_wrapped(tmp_path: Path) -> None:
    y = (np.arange(100) % 10).astype(np.uint64)
    y[3] = np.iinfo(np.uint64).max
    np.savez(tmp_path / "u64.npz", x=np.zeros((100, 8, 8), np.uint8), y=y)
    with pytest.raises(DataError, match=str(np.iinfo(np.uint64).max)) as info:
        load_dataset(f"npz:{tmp_path / 'u64.npz'}")
    assert "got -1" not in str(info.value)
    assert f"at most {MAX_CLASSES:,} classes" in str(info.value)


def test_labels_up_to_the_class_limit_still_load(tmp_path: Path) -> None:
    y = np.repeat([0, MAX_CLASSES - 1], 4)
    np.savez(tmp_path / "wide.npz", x=np.zeros((8, 3, 3), np.uint8), y=y)
    assert load_dataset(f"npz:{tmp_path / 'wide.npz'}").num_classes == MAX_CLASSES


def test_classes_shorter_than_the_labels_name_the_classes_array(tmp_path: Path) -> None:
    x, y = np.zeros((40, 8, 8), np.uint8), np.arange(40) % 4
    np.savez(tmp_path / "short.npz", x=x, y=y, classes=np.array(["a", "b"]))
    with pytest.raises(DataError, match=r"2 names of array 'classes', got labels up to 3"):
        load_dataset(f"npz:{tmp_path / 'short.npz'}")


# ----------------------------------------------------------------------------- bombs


def test_an_npz_bomb_is_refused_from_its_headers(tmp_path: Path) -> None:
    npz_bomb(tmp_path / "bomb.npz")
    assert (tmp_path / "bomb.npz").stat().st_size < 3 * 2**20
    config = write_config(tmp_path, dataset="npz:bomb.npz")
    child = run_child(tmp_path, "run", str(config), "--out", "out", "--quiet")
    assert_refused(child, tmp_path / "out", "npz:bomb.npz: its arrays would take 4.58 GiB",
                   "limit of 2 GiB")  # fmt: skip


def test_an_npz_bomb_is_a_valid_archive(tmp_path: Path) -> None:
    """The hand-made deflate stream is what zlib and numpy read (checked on a small one)."""
    write_zip(tmp_path / "small.npz", {
        "x.npy": (npy_header((3, 1 << 20), "|u1"), 3 << 20),
        "y.npy": (npy_header((3,), "<i8"), 24),
    })  # fmt: skip
    with np.load(tmp_path / "small.npz") as archive:
        assert archive["x"].shape == (3, 1 << 20) and not archive["x"].any()
        assert archive["y"].tolist() == [0, 0, 0]


def test_an_npz_member_that_is_no_npy_array_is_refused_unread(tmp_path: Path) -> None:
    # np.load hands back the raw bytes of such a member, inflated whole.
    write_zip(tmp_path / "raw.npz", {"x": (b"", 1 << 20), "y.npy": (npy_header((2,), "<i8"), 16)})
    with pytest.raises(DataError, match=r"raw\.npz array 'x': is not an \.npy array"):
        load_dataset(f"npz:{tmp_path / 'raw.npz'}")


def test_an_idx_gzip_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    zeros = 6 * 2**30  # probe 6: 6 GB of concatenated gzip members
    idx_gzip_bomb(tmp_path / "idx", zeros // 784, zeros)
    assert (tmp_path / "idx" / "t10k-images-idx3-ubyte.gz").stat().st_size < 10 * 2**20
    config = write_config(tmp_path, dataset="idx:idx")
    child = run_child(tmp_path, "run", str(config), "--out", "out", "--quiet")
    assert_refused(child, tmp_path / "out", "t10k-images-idx3-ubyte.gz: its arrays would take",
                   "limit of 2 GiB")  # fmt: skip


def test_an_idx_stream_longer_than_its_header_is_not_inflated(tmp_path: Path) -> None:
    idx_gzip_bomb(tmp_path / "idx", 10, 6 * 2**30)  # the header claims 10 images
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: has trailing bytes"):
        load_dataset(f"idx:{tmp_path / 'idx'}")
    assert time.perf_counter() - start < 5  # inflating 6 GB would take far longer


def test_a_keras_bomb_is_refused_before_keras_opens_it(tmp_path: Path) -> None:
    write_zip(tmp_path / "bomb.keras", {
        "metadata.json": (b"{}", 0),
        "config.json": (b"{}", 0),
        "model.weights.h5": (b"", 3 * 2**30),  # probe 6: a 3 GB weights member
    })  # fmt: skip
    assert (tmp_path / "bomb.keras").stat().st_size < 20 * 2**20
    config = write_config(tmp_path, model="keras:bomb.keras")
    child = run_child(tmp_path, "run", str(config), "--out", "out", "--quiet")
    assert_refused(child, tmp_path / "out", "model keras:bomb.keras:",
                   "'model.weights.h5' inflates", "decompression bomb")  # fmt: skip


def test_a_keras_archive_above_the_size_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(saved_models, "MAX_MODEL_BYTES", 2**20)
    path = tmp_path / "big.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:  # as Keras writes them
        archive.writestr("model.weights.h5", bytes(2 * 2**20))
    with pytest.raises(ConfigError, match=r"big\.keras.*inflates to .* GiB, above the limit"):
        saved_models.saved_model_path(f"keras:{path}")


@pytest.mark.parametrize("content", [b"hello", b""])
def test_a_keras_file_that_is_no_zip_says_so(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "junk.keras").write_bytes(content)
    config = write_config(tmp_path, model=f"keras:{tmp_path / 'junk.keras'}")
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    line = assert_one_line(result.code, result.err, "junk.keras", "not a zip archive")
    assert "File not found" not in line
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- image sizes


def test_large_folder_images_without_image_size_are_refused_before_out_is_written(
    tmp_path: Path,
) -> None:
    for label in ("a", "b"):  # probe 7: 4096 x 4096 images, no image_size
        (tmp_path / "photos" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (4096, 4096)).save(tmp_path / "photos" / label / f"{i}.png")
    config = write_config(tmp_path, dataset="folder:photos")
    child = run_child(tmp_path, "run", str(config), "--out", "out", "--quiet")
    assert_refused(child, tmp_path / "out", "0.png: 4096x4096 pixels, larger than 1024",
                   "set image_size")  # fmt: skip


@pytest.mark.parametrize(
    ("size", "needle"),
    [
        ("[100000, 100000]", "image_size must be [height, width] of integers in [1, 1024]"),
        ("[1025, 8]", "image_size must be [height, width] of integers in [1, 1024]"),
        ("[1024, 1024]", "image_size [1024, 1024]: digits's 1797 images would take 7.02 GiB"),
    ],
)
def test_image_size_is_bounded(tmp_path: Path, size: str, needle: str) -> None:
    config = write_config(tmp_path, extra=f"image_size = {size}\n")
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line(result.code, result.err, needle)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- configs


def test_a_5000_deep_toml_array_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000  # probe 19: tomllib's RecursionError
    config = write_config(tmp_path, extra=f"deep = {deep}\n")
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line(result.code, result.err, "run.toml: arrays or tables nested more than 32")
    plain = write_config(tmp_path, name="plain")
    result = run_cli("run", str(plain), "--set", f"images={deep}", "--out", str(tmp_path / "o"))
    assert_one_line(result.code, result.err, "--set images=...: arrays or tables nested")
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("depth", [33, 400, 495])
def test_a_config_nested_just_parseable_is_one_line_too(tmp_path: Path, depth: int) -> None:
    """Depths tomllib reads would still overflow the config's own readers (copies, checks)."""
    nested = "[" * depth + "1" + "]" * depth
    config = write_config(tmp_path, extra=f"deep = {nested}\n")
    with pytest.raises(ConfigError, match="nested more than 32 levels deep"):
        load_config(config)


def test_too_many_seeds_are_refused(tmp_path: Path) -> None:
    seeds = ", ".join(map(str, range(10_000)))  # probe 19: 10,000 seeds
    config = write_config(tmp_path).read_text(encoding="utf-8")
    (tmp_path / "run.toml").write_text(config.replace("seeds = [0]", f"seeds = [{seeds}]"))
    result = run_cli("run", str(tmp_path / "run.toml"), "--out", str(tmp_path / "out"))
    line = assert_one_line(result.code, result.err, f"1 to {MAX_SEEDS} integers", "10000 seeds")
    assert len(line) < 300


def test_a_5000_value_sweep_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    sigmas = ", ".join(f"{1e-4 * (i + 1):.6g}" for i in range(5000))  # probe 19
    config = write_config(tmp_path).read_text(encoding="utf-8")
    sweep = f'[[defense]]\nname = "gaussian"\nsigma = [{sigmas}]\n'
    (tmp_path / "run.toml").write_text(config.replace("[training]", sweep + "\n[training]"))
    result = run_cli("run", str(tmp_path / "run.toml"), "--out", str(tmp_path / "out"))
    assert_one_line(result.code, result.err, "defense: the [[defense]] tables make 5001",
                    f"at most {MAX_CONFIGURATIONS}")  # fmt: skip


def test_a_plan_of_too_many_trials_is_refused(tmp_path: Path) -> None:
    seeds = ", ".join(map(str, range(1000)))
    config = write_config(tmp_path).read_text(encoding="utf-8")
    config = config.replace("seeds = [0]", f"seeds = [{seeds}]")
    (tmp_path / "run.toml").write_text(config.replace("images = 2", "images = 1001"))
    # Refused from the config alone: digits could not even hold 1001 images.
    with pytest.raises(ConfigError, match=rf"plans 1,001,000 trials .* {MAX_PLANNED_TRIALS:,};"):
        load_config(tmp_path / "run.toml")


COMMITTED = sorted(
    [REPO / "bench" / "run" / "default.toml"]
    + list((REPO / "results").rglob("config.toml"))
    + list((REPO / "benchmarks").rglob("*.toml"))
)


def test_every_committed_config_still_loads() -> None:
    assert len(COMMITTED) > 50
    for path in COMMITTED:
        # The bounds refuse none of them. Read as text (`parse_config`): a run's record names
        # its data relative to where it ran, and the shared data may be absent here. A record
        # that states no protocol is of protocol 1, as `load_record` reads it.
        text = path.read_text(encoding="utf-8")
        if path.name == "config.toml" and "protocol" not in tomllib.loads(text):
            text = f"protocol = {RECORD_PROTOCOL}\n{text}"
        parse_config(text, str(path))


# ----------------------------------------------------------------------------- disk full, store


def test_disk_full_is_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"

    def full(out_dir: Path, *args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out_dir / "config.toml"))

    monkeypatch.setattr(runner, "write_records", full)
    result = run_cli("run", str(write_config(tmp_path)), "--out", str(out), "--quiet")
    line = assert_one_line(result.code, result.err)
    assert line == f"leakbench: error: {out / 'config.toml'}: no space left on device; {RESUME}"


def test_other_os_errors_keep_their_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(runner, "write_records", broken)
    with pytest.raises(OSError, match="Input/output error"):
        run_cli("run", str(write_config(tmp_path)), "--out", str(tmp_path / "out"), "--quiet")


def _mount_tmpfs(where: Path, size: str) -> bool:
    """Mounts a tmpfs of ``size`` at ``where``; False where that is not allowed."""
    if shutil.which("mount") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    return done.returncode == 0


def test_a_real_full_disk_is_one_line_and_the_run_resumes(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "100k"):  # probe 24: a 100 KB tmpfs
        pytest.skip("cannot mount a tmpfs here; test_disk_full_is_one_line_naming_the_file "
                    "simulates it")  # fmt: skip
    try:
        config, out = str(write_config(tmp_path)), str(disk / "run")
        result = run_cli("run", config, "--out", out, "--quiet", "--workers", "1")
        assert_one_line(result.code, result.err, f"no space left on device; {RESUME}")
        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)
        again = run_cli("run", config, "--out", out, "--quiet", "--workers", "1")
        assert again.code == 0, again.err
        assert (disk / "run" / "trials.csv").is_file()
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_sqlite_disk_full_is_the_os_error_of_a_full_disk(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite")
    try:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 1}")
        with pytest.raises(OSError) as info:
            store.add("k", [{"blob": "x" * 100_000}])
        assert info.value.errno == errno.ENOSPC
        assert info.value.filename == str(tmp_path / "store.sqlite")
        assert store.keys() == set()  # the transaction was rolled back
    finally:
        store.close()


def test_a_refused_truncated_store_leaves_no_new_files(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = Store(path)
    store.add("k", [{"row": "x" * 10_000}])
    store.close()
    with path.open("r+b") as handle:  # probe 22: a store truncated to 4 KB
        handle.truncate(4096)
    before = sorted(p.name for p in tmp_path.iterdir())
    for readonly in (True, False):
        with pytest.raises(DataError, match="is not a leakbench results store"):
            Store(path, readonly=readonly)
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_store_that_fails_to_open_keeps_wal_files_it_did_not_make(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"x" * 4096)
    (tmp_path / "store.sqlite-wal").write_bytes(b"")
    with pytest.raises(DataError):
        Store(path)
    assert (tmp_path / "store.sqlite-wal").exists()
    assert not (tmp_path / "store.sqlite-shm").exists()
