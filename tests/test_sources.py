"""The readers' one door for files: the text, or one line naming the parameter and why not."""

import gzip
import os
import threading

import pytest

from labutils.core.inputs import LabInputError
from labutils.readers import sources
from labutils.readers.sources import MAX_TEXT_BYTES, read_text


def _refused(path, **kw) -> str:
    with pytest.raises(LabInputError) as info:
        read_text(path, "log", "; give the log", **kw)
    message = str(info.value)
    assert message.startswith("log=") and message.endswith("; give the log") and "\n" not in message
    return message


def test_the_text_comes_back_with_undecodable_bytes_replaced(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"GPU0\t X \n\xff\n")
    assert read_text(path, "log") == "GPU0\t X \n\ufffd\n"


def test_utf16_with_a_byte_order_mark_and_utf8_with_one_are_text(tmp_path):
    """What Windows PowerShell's `nvidia-smi topo -m > topo.txt` writes is UTF-16 with a BOM."""
    (tmp_path / "u16.txt").write_bytes("\tGPU0\tGPU1\n".encode("utf-16"))
    (tmp_path / "u8.txt").write_bytes(b"\xef\xbb\xbf\tGPU0\n")
    assert read_text(tmp_path / "u16.txt", "log") == "\tGPU0\tGPU1\n"
    assert read_text(tmp_path / "u8.txt", "log") == "\tGPU0\n"


@pytest.mark.parametrize("make, words", [
    (lambda d: "", "log='' names no file"),
    (lambda d: d, "is a directory (a folder), not a file"),
    (lambda d: d / "missing.log", "does not exist"),
    (lambda d: "/dev/null", "is a character device, not a regular file"),
    (lambda d: "/dev/zero", "is a character device, not a regular file"),
    (lambda d: "bad\0name", "cannot be read (ValueError"),
])
def test_what_cannot_be_read_is_one_line_naming_it(tmp_path, make, words):
    assert words in _refused(make(tmp_path))


def test_a_fifo_is_named_as_one_and_never_waited_on(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(_refused(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)  # a reader that opened the pipe would wait for a writer forever
    assert not reader.is_alive(), "read_text waited on a FIFO"
    assert "named pipe (FIFO)" in got[0] and "does not exist" not in got[0]


def test_a_path_through_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "a part of the path is a file" in _refused(tmp_path / "f" / "log")


def test_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "secret.log"
    path.write_text("NCCL INFO\n")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources, "open", denied, raising=False)  # root reads every file: fake the refusal
    assert "cannot be read: permission denied" in _refused(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_file_really(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text("NCCL INFO\n")
    path.chmod(0)
    assert "permission denied" in _refused(path)


def test_the_size_cap_is_named_and_the_caller_may_set_its_own(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(b"x" * 2_000_001)
    assert "is 2.0 MB, over the 2 MB this reader takes" in _refused(path, max_bytes=2_000_000)
    assert read_text(path, "log") == "x" * 2_000_001
    assert MAX_TEXT_BYTES == 64_000_000  # the default, named "64 MB" in its message (below)


def test_a_sparse_file_over_the_default_cap_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as f:
        f.truncate(200_000_000)  # 200 MB of holes: refused by its size, at once
    assert "is 200.0 MB, over the 64 MB this reader takes" in _refused(path)  # refused by its size


@pytest.mark.parametrize("data, words", [
    (b"GPU0\x00\x00\x01\x02", "binary data (NUL bytes), not text"),
    (bytes(range(128, 256)) * 4, "binary data (512 of 512 characters are not UTF-8), not text"),
    (gzip.compress(b"NCCL INFO Channel 00/0", mtime=0), "gzip-compressed data"),
    (b"\x7fELF\x02\x01\x01" + b"\x00" * 9, "a program (an ELF executable)"),
    (b"PK\x03\x04rest", "a zip archive"),
], ids=["nul", "undecodable", "gzip", "elf", "zip"])
def test_binary_files_say_what_they_look_like(tmp_path, data, words):
    path = tmp_path / "thing.log"
    path.write_bytes(data)
    assert words in _refused(path)


def test_a_few_latin1_bytes_in_a_log_are_still_text(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"host caf\xe9 NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n" * 3)
    assert read_text(path, "log").count("\ufffd") == 3


@pytest.mark.parametrize("argv", [["nccl-transports"], ["topo", "--file"], ["doctor", "--facts"]])
@pytest.mark.parametrize("make, words", [
    (lambda d: "/dev/zero", "is a character device"),
    (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], "is a named pipe (FIFO)"),
    (lambda d: d, "is a directory"),
    (lambda d: ((d / "x.bin").write_bytes(b"\x00" * 64), d / "x.bin")[1], "binary data (NUL bytes), not text"),
    (lambda d: ((d / "x.gz").write_bytes(gzip.compress(b"GPU0")), d / "x.gz")[1], "gzip-compressed data"),
])
def test_every_reader_command_refuses_a_hostile_file_in_one_line(tmp_path, capsys, argv, make, words):
    from labutils.cli import main

    path = make(tmp_path)
    assert main([*argv, str(path)]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and words in captured.err and str(path) in captured.err
